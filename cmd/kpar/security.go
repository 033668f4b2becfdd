package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// securityOpts holds the TLS and SASL flags that every command talking to
// Kafka shares. Register them with securityFlags before parsing, then turn
// them into client options with kgoOpts.
type securityOpts struct {
	tls       bool
	caFile    string
	certFile  string
	keyFile   string
	mechanism string
	user      string
	password  string
}

// securityFlags registers --tls, --tls-ca, --tls-cert, --tls-key,
// --sasl-mechanism, --sasl-user and --sasl-password on fs.
func securityFlags(fs *flagSet) *securityOpts {
	s := &securityOpts{}
	fs.BoolVar(&s.tls, "tls", false, "connect to the brokers with TLS, verified against the system's CAs (implied by --tls-ca, --tls-cert)")
	fs.StringVar(&s.caFile, "tls-ca", "", "verify the brokers against the PEM CA certificates in `FILE` instead of the system's (implies --tls)")
	fs.StringVar(&s.certFile, "tls-cert", "", "present the PEM client certificate in `FILE` (needs --tls-key; implies --tls)")
	fs.StringVar(&s.keyFile, "tls-key", "", "PEM private key `FILE` of --tls-cert")
	fs.StringVar(&s.mechanism, "sasl-mechanism", "", "authenticate with SASL `MECHANISM`: plain, scram-sha-256 or scram-sha-512 (needs --sasl-user, --sasl-password)")
	fs.StringVar(&s.user, "sasl-user", "", "SASL user `NAME`")
	fs.StringVar(&s.password, "sasl-password", "", "SASL `PASSWORD`; prefer the KPAR_SASL_PASSWORD variable, which other users cannot read in the process list")
	return s
}

// usesTLS reports whether the flags ask for TLS.
func (s *securityOpts) usesTLS() bool {
	return s.tls || s.caFile != "" || s.certFile != "" || s.keyFile != ""
}

// saslMechanism returns the canonical SASL mechanism name ("PLAIN",
// "SCRAM-SHA-256", ...), or "" for none.
func (s *securityOpts) saslMechanism() string {
	return strings.ToUpper(strings.TrimSpace(s.mechanism))
}

// kgoOpts validates the flags and returns the client options they make.
// Its errors name the flag at fault and fit on one line, for usageError.
func (s *securityOpts) kgoOpts() ([]kgo.Opt, error) {
	var opts []kgo.Opt
	if s.usesTLS() {
		cfg, err := s.tlsConfig()
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.DialTLSConfig(cfg))
	}
	m, err := s.sasl()
	if err != nil {
		return nil, err
	}
	if m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}

func (s *securityOpts) tlsConfig() (*tls.Config, error) {
	// kgo fills in ServerName from each broker's host.
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if s.caFile != "" {
		pem, err := os.ReadFile(s.caFile)
		if err != nil {
			return nil, fmt.Errorf("invalid --tls-ca: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("invalid --tls-ca: no PEM certificate in %s", s.caFile)
		}
		cfg.RootCAs = pool
	}
	switch {
	case s.certFile != "" && s.keyFile == "":
		return nil, errors.New("--tls-cert needs --tls-key")
	case s.certFile == "" && s.keyFile != "":
		return nil, errors.New("--tls-key needs --tls-cert")
	case s.certFile != "":
		cert, err := tls.LoadX509KeyPair(s.certFile, s.keyFile)
		if err != nil {
			return nil, fmt.Errorf("invalid --tls-cert/--tls-key: %v", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

func (s *securityOpts) sasl() (sasl.Mechanism, error) {
	mech := s.saslMechanism()
	if mech == "" {
		switch {
		case s.user != "":
			return nil, errors.New("--sasl-user needs --sasl-mechanism")
		case s.password != "":
			return nil, errors.New("--sasl-password (or KPAR_SASL_PASSWORD) needs --sasl-mechanism")
		}
		return nil, nil
	}
	switch {
	case mech != "PLAIN" && mech != "SCRAM-SHA-256" && mech != "SCRAM-SHA-512":
		return nil, fmt.Errorf("invalid --sasl-mechanism %q: use plain, scram-sha-256 or scram-sha-512", s.mechanism)
	case s.user == "":
		return nil, fmt.Errorf("--sasl-mechanism %s needs --sasl-user", s.mechanism)
	case s.password == "":
		return nil, fmt.Errorf("--sasl-mechanism %s needs --sasl-password or KPAR_SASL_PASSWORD", s.mechanism)
	}
	switch mech {
	case "PLAIN":
		return plain.Auth{User: s.user, Pass: s.password}.AsMechanism(), nil
	case "SCRAM-SHA-256":
		return scram.Auth{User: s.user, Pass: s.password}.AsSha256Mechanism(), nil
	default:
		return scram.Auth{User: s.user, Pass: s.password}.AsSha512Mechanism(), nil
	}
}

// plainTextPassword reports whether the flags send a SASL PLAIN password
// without TLS, readable by anyone on the path: worth a warning.
func (s *securityOpts) plainTextPassword() bool {
	return s.saslMechanism() == "PLAIN" && !s.usesTLS()
}

// checkBrokers connects to the brokers once, as a client with these
// security options would, and returns an error saying what to fix when they
// refuse us. franz-go retries failing connections forever, and a broker that
// rejects a password may simply close the connection (kfake does, and so do
// Kafka brokers speaking the old SASL handshake): without this check a wrong
// password or certificate is a quiet retry loop.
//
// Unreachable brokers are retried until timeout; a rejected password or an
// untrusted certificate fails at once.
func (s *securityOpts) checkBrokers(ctx context.Context, seeds []string, timeout time.Duration, extra ...kgo.Opt) error {
	opts := append([]kgo.Opt{kgo.SeedBrokers(seeds...), kgo.DialTimeout(5 * time.Second)}, extra...)
	if s.usesTLS() {
		cfg, err := s.tlsConfig()
		if err != nil {
			return err
		}
		opts = append(opts, kgo.DialTLSConfig(cfg))
	}
	m, err := s.sasl()
	if err != nil {
		return err
	}
	var watch *saslWatch
	if m != nil {
		watch = &saslWatch{Mechanism: m}
		opts = append(opts, kgo.SASL(watch))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()

	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	backoff := 100 * time.Millisecond
	rejected := 0 // consecutive attempts whose connection closed mid-SASL
	for {
		var before int64
		if watch != nil {
			before = watch.unfinished()
		}
		err := cl.Ping(ctx)
		if err == nil {
			return nil
		}
		if fatal := s.explainConnectError(err); fatal != nil {
			return fatal
		}
		if watch != nil && watch.unfinished() > before {
			// The broker hung up on our credentials. Once could be a
			// broker restarting mid-handshake; twice is a refusal.
			if rejected++; rejected >= 2 {
				return fmt.Errorf("SASL %s authentication as %q was rejected (the broker closed the connection): check --sasl-user, --sasl-password (KPAR_SASL_PASSWORD) and --sasl-mechanism: %w", watch.Name(), s.user, err)
			}
		} else {
			rejected = 0
		}
		select {
		case <-ctx.Done():
			if parent := context.Cause(ctx); parent != nil && !errors.Is(parent, context.DeadlineExceeded) {
				return parent
			}
			return fmt.Errorf("no broker of %s answered within %v%s: %w", strings.Join(seeds, ","), timeout, s.listenerHint(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// explainConnectError returns a one-line explanation for errors that
// retrying cannot fix, and nil for the others.
func (s *securityOpts) explainConnectError(err error) error {
	var (
		verify *tls.CertificateVerificationError
		record tls.RecordHeaderError
	)
	switch {
	case errors.Is(err, kerr.SaslAuthenticationFailed):
		return fmt.Errorf("SASL %s authentication as %q failed: check --sasl-user, --sasl-password (KPAR_SASL_PASSWORD) and --sasl-mechanism: %w", s.saslMechanism(), s.user, err)
	case errors.Is(err, kerr.UnsupportedSaslMechanism), errors.Is(err, kerr.IllegalSaslState):
		return fmt.Errorf("the brokers do not accept SASL %s: check --sasl-mechanism: %w", s.saslMechanism(), err)
	case errors.Is(err, kerr.ClusterAuthorizationFailed), errors.Is(err, kerr.TopicAuthorizationFailed),
		errors.Is(err, kerr.GroupAuthorizationFailed):
		return fmt.Errorf("%q is not authorised: check the brokers' ACLs: %w", s.user, err)
	case errors.As(err, &verify):
		return fmt.Errorf("TLS: the brokers' certificate is not trusted: check --tls-ca: %w", err)
	case errors.As(err, &record):
		return fmt.Errorf("TLS: the brokers do not speak TLS on this port: drop --tls/--tls-ca or use their TLS listener: %w", err)
	}
	return nil
}

// listenerHint says what to check when brokers close connections without a
// reason, which is what a TLS / plaintext mismatch looks like.
func (s *securityOpts) listenerHint() string {
	if s.usesTLS() {
		return " (if the listener is plaintext, drop the --tls flags)"
	}
	return " (if the listener expects TLS, add --tls or --tls-ca)"
}

// saslWatch wraps a SASL mechanism to count authentications that started
// and never finished: a broker that rejects credentials by closing the
// connection leaves one behind.
type saslWatch struct {
	sasl.Mechanism
	started  atomic.Int64
	finished atomic.Int64
}

func (w *saslWatch) unfinished() int64 { return w.started.Load() - w.finished.Load() }

func (w *saslWatch) Authenticate(ctx context.Context, host string) (sasl.Session, []byte, error) {
	s, first, err := w.Mechanism.Authenticate(ctx, host)
	if err != nil {
		return nil, nil, err
	}
	w.started.Add(1)
	return &watchedSession{Session: s, w: w}, first, nil
}

type watchedSession struct {
	sasl.Session
	w *saslWatch
}

func (s *watchedSession) Challenge(b []byte) (bool, []byte, error) {
	done, resp, err := s.Session.Challenge(b)
	if done || err != nil {
		// Finished, either way: a failure here is the client's own
		// verdict (SCRAM checks the server), reported as an error.
		s.w.finished.Add(1)
	}
	return done, resp, err
}
