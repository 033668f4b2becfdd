package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
)

// parseSecurity registers the security flags on a fresh flag set and
// parses args.
func parseSecurity(t *testing.T, args ...string) *securityOpts {
	t.Helper()
	fs := newFlagSet("test", "", io.Discard)
	s := securityFlags(fs)
	if code, ok := fs.parse(args); !ok {
		t.Fatalf("parse %q: exit code %d", args, code)
	}
	return s
}

// writeCertFiles writes a self-signed certificate and its key as PEM files
// and returns their paths.
func writeCertFiles(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	cfg, certPEM := selfSigned(t)
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	keyDER, err := x509.MarshalPKCS8PrivateKey(cfg.Certificates[0].PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func TestSecurityFlagsMakeClientOptions(t *testing.T) {
	certFile, keyFile := writeCertFiles(t)
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		opts int  // client options expected
		tls  bool // usesTLS
	}{
		{"none", nil, nil, 0, false},
		{"tls with system roots", []string{"--tls"}, nil, 1, true},
		{"tls from env", nil, map[string]string{"KPAR_TLS": "true"}, 1, true},
		{"ca implies tls", []string{"--tls-ca", certFile}, nil, 1, true},
		{"client certificate", []string{"--tls-cert", certFile, "--tls-key", keyFile}, nil, 1, true},
		{"plain", []string{"--sasl-mechanism", "plain", "--sasl-user", "u", "--sasl-password", "p"}, nil, 1, false},
		{"password from env", []string{"--sasl-mechanism", "SCRAM-SHA-256", "--sasl-user", "u"},
			map[string]string{"KPAR_SASL_PASSWORD": "p"}, 1, false},
		{"everything from env", nil, map[string]string{
			"KPAR_TLS_CA": certFile, "KPAR_SASL_MECHANISM": "scram-sha-512",
			"KPAR_SASL_USER": "u", "KPAR_SASL_PASSWORD": "p",
		}, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			s := parseSecurity(t, tc.args...)
			opts, err := s.kgoOpts()
			if err != nil {
				t.Fatalf("kgoOpts: %v", err)
			}
			if len(opts) != tc.opts {
				t.Errorf("%d client options, want %d", len(opts), tc.opts)
			}
			if s.usesTLS() != tc.tls {
				t.Errorf("usesTLS %v, want %v", s.usesTLS(), tc.tls)
			}
		})
	}
}

func TestSecurityTLSConfigLoadsFiles(t *testing.T) {
	certFile, keyFile := writeCertFiles(t)
	s := parseSecurity(t, "--tls-ca", certFile, "--tls-cert", certFile, "--tls-key", keyFile)
	cfg, err := s.tlsConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RootCAs == nil || len(cfg.Certificates) != 1 {
		t.Errorf("RootCAs %v, %d certificates; want the CA and one client certificate", cfg.RootCAs, len(cfg.Certificates))
	}
	if cfg.InsecureSkipVerify {
		t.Error("InsecureSkipVerify is set")
	}
}

func TestSecurityFlagsRejectBadCombinations(t *testing.T) {
	certFile, keyFile := writeCertFiles(t)
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		flag string // the error must name it
	}{
		{"missing ca file", []string{"--tls-ca", "/nonexistent/ca.pem"}, "--tls-ca"},
		{"ca file without pem", []string{"--tls-ca", notPEM}, "--tls-ca"},
		{"cert without key", []string{"--tls-cert", certFile}, "--tls-key"},
		{"key without cert", []string{"--tls-key", keyFile}, "--tls-cert"},
		{"key that is no key", []string{"--tls-cert", certFile, "--tls-key", certFile}, "--tls-key"},
		{"unknown mechanism", []string{"--sasl-mechanism", "oauthbearer", "--sasl-user", "u", "--sasl-password", "p"}, "--sasl-mechanism"},
		{"mechanism without user", []string{"--sasl-mechanism", "plain", "--sasl-password", "p"}, "--sasl-user"},
		{"mechanism without password", []string{"--sasl-mechanism", "plain", "--sasl-user", "u"}, "--sasl-password"},
		{"user without mechanism", []string{"--sasl-user", "u"}, "--sasl-mechanism"},
		{"password without mechanism", []string{"--sasl-password", "p"}, "--sasl-mechanism"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseSecurity(t, tc.args...).kgoOpts()
			if err == nil {
				t.Fatal("kgoOpts succeeded, want an error")
			}
			if msg := err.Error(); !strings.Contains(msg, tc.flag) || strings.Contains(msg, "\n") {
				t.Errorf("error %q, want one line naming %s", msg, tc.flag)
			}
		})
	}
}

// TestSecurityCheckBrokers runs the startup check against a kfake cluster
// that requires TLS and SASL.
func TestSecurityCheckBrokers(t *testing.T) {
	t.Parallel()
	addr, caFile := secureCluster(t)
	for _, tc := range []struct {
		name string
		args []string
		want string // in the error; "" for success
	}{
		{"plain", []string{"--tls-ca", caFile, "--sasl-mechanism", "plain", "--sasl-user", "admin", "--sasl-password", "secret"}, ""},
		{"scram-sha-256", []string{"--tls-ca", caFile, "--sasl-mechanism", "scram-sha-256", "--sasl-user", "admin", "--sasl-password", "secret"}, ""},
		{"scram-sha-512", []string{"--tls-ca", caFile, "--sasl-mechanism", "scram-sha-512", "--sasl-user", "admin", "--sasl-password", "secret"}, ""},
		{"wrong plain password", []string{"--tls-ca", caFile, "--sasl-mechanism", "plain", "--sasl-user", "admin", "--sasl-password", "nope"}, "rejected"},
		{"wrong scram password", []string{"--tls-ca", caFile, "--sasl-mechanism", "scram-sha-512", "--sasl-user", "admin", "--sasl-password", "nope"}, "rejected"},
		{"untrusted certificate", []string{"--tls", "--sasl-mechanism", "plain", "--sasl-user", "admin", "--sasl-password", "secret"}, "not trusted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			err := parseSecurity(t, tc.args...).checkBrokers(ctx, []string{addr}, 15*time.Second)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("checkBrokers: %v, want success", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("checkBrokers: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

func TestSecurityCheckBrokersGivesUpOnUnreachableBrokers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	s := parseSecurity(t)

	err = s.checkBrokers(t.Context(), []string{addr}, 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "answered within") || !strings.Contains(err.Error(), "--tls") {
		t.Errorf("checkBrokers: %v, want it to say no broker answered, with a TLS hint", err)
	}

	ctx, cancel := context.WithCancelCause(t.Context())
	stopped := errors.New("stopped by the test")
	cancel(stopped)
	if err := s.checkBrokers(ctx, []string{addr}, time.Minute); !errors.Is(err, stopped) && !errors.Is(err, context.Canceled) {
		t.Errorf("checkBrokers with a cancelled context: %v, want the cancellation", err)
	}
}

func TestSecurityExplainsFatalErrors(t *testing.T) {
	s := parseSecurity(t, "--sasl-mechanism", "plain", "--sasl-user", "u", "--sasl-password", "p")
	for _, tc := range []struct {
		err  error
		want string // "" for not fatal
	}{
		{kerr.SaslAuthenticationFailed, "--sasl-password"},
		{kerr.UnsupportedSaslMechanism, "--sasl-mechanism"},
		{kerr.GroupAuthorizationFailed, "ACLs"},
		{io.EOF, ""},
		{context.DeadlineExceeded, ""},
	} {
		got := s.explainConnectError(tc.err)
		switch {
		case tc.want == "" && got != nil:
			t.Errorf("%v: explained as %v, want it left to retries", tc.err, got)
		case tc.want != "" && (got == nil || !strings.Contains(got.Error(), tc.want) || !errors.Is(got, tc.err)):
			t.Errorf("%v: explained as %v, want a wrapping error naming %s", tc.err, got, tc.want)
		}
	}
}
