package forward

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/kpar/kpar"
)

// StatusError is a response that was not 2xx, or in a batch a record's own
// status that was not. Handle returns it wrapped in kpar.Permanent,
// kpar.Overloaded or kpar.RetryAfter as its status requires; errors.As
// finds it through all of them.
type StatusError struct {
	StatusCode int    // the response's status code, or the record's in a batch
	Status     string // the response's status line, "500 Internal Server Error"
	URL        string // the URL posted to, with any password redacted
	// Body is the start of the response body (up to 512 bytes, as
	// printable text), which often says what was wrong with the record.
	// Empty for a record's own status in a batch's answer (see Reason).
	Body string
	// Reason is the "error" the endpoint gave for this record in a batch
	// answer of objects (up to 512 bytes, as printable text).
	Reason string
	// RetryAfter is the wait the server asked for (Retry-After on a 429 or
	// 503, or a batch answer's retry_after), capped at MaxRetryAfter; 0
	// when it asked for none.
	RetryAfter time.Duration
	// Batch is the number of records in the request when it was a batch
	// (Batch option), else 0.
	Batch int
}

// Error reads "forward: POST URL: STATUS [(in a batch of N)] [(retry after
// D)]: REASON or BODY": the text kpar logs and puts in a dead letter's
// __dlq.errors.message header.
func (e *StatusError) Error() string {
	msg := fmt.Sprintf("forward: POST %s: %s", e.URL, e.Status)
	if e.Batch > 0 {
		msg += fmt.Sprintf(" (in a batch of %d)", e.Batch)
	}
	if e.RetryAfter > 0 {
		msg += fmt.Sprintf(" (retry after %v)", e.RetryAfter)
	}
	switch {
	case e.Reason != "":
		msg += ": " + e.Reason
	case e.Body != "":
		msg += ": " + e.Body
	}
	return msg
}

// TLSError is a request that failed because the endpoint's certificate
// did not verify (or the endpoint does not speak TLS at all): a
// configuration error, not the record's fault, so Handle returns it marked
// kpar.Misconfigured. kpar holds the records (no attempt counted, nothing
// dead-lettered), probes the endpoint ever more slowly, logs at ERROR what
// to fix, and goes on once the certificate verifies again (it was renewed,
// or the trusted CA was added; a load balancer's bad backend was taken
// out). CheckTLS finds it before the first record.
type TLSError struct {
	Host string // the URL's host:port
	Err  error  // the TLS or x509 error
}

func (e *TLSError) Error() string {
	var notTLS tls.RecordHeaderError
	if errors.As(e.Err, &notTLS) {
		return fmt.Sprintf("forward: %s does not speak TLS, a configuration error (not an overload): %v; "+
			"use an http:// URL, or the endpoint's TLS port", e.Host, e.Err)
	}
	return fmt.Sprintf("forward: the TLS certificate of %s does not verify, a configuration error (not an overload): %v; "+
		"trust its CA (TLSConfig RootCAs; kpar forward --url-ca FILE) or fix the endpoint's certificate", e.Host, e.Err)
}

func (e *TLSError) Unwrap() error { return e.Err }

// tlsProblem reports whether err is a certificate that does not verify,
// or a peer that does not speak TLS.
func tlsProblem(err error) bool {
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		notTLS   tls.RecordHeaderError
	)
	return errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &hostname) ||
		errors.As(err, &invalid) || errors.As(err, &notTLS)
}

// failure reads a non-2xx response into its error and closes it.
func (h *Handler) failure(resp *http.Response) error {
	serr := &StatusError{StatusCode: resp.StatusCode, Status: resp.Status, URL: h.redactedURL}
	serr.Body = snippet(resp.Body)
	drain(resp)
	return h.classify(serr, resp.Header.Get("Retry-After"))
}

// classify wraps serr as its status requires. retryAfter is the response's
// Retry-After header, honoured on 429 and 503; a RetryAfter already in
// serr (a batch answer's retry_after) applies to any retryable status.
func (h *Handler) classify(serr *StatusError, retryAfter string) error {
	var err error = serr
	switch c := serr.StatusCode; {
	case c >= 200 && c <= 299:
		return nil
	case c == http.StatusTooManyRequests || c == http.StatusServiceUnavailable:
		// The endpoint pushing back (kpar.Overloaded: see
		// kpar.AdaptiveConcurrency), with the wait it asked for, if any.
		if serr.RetryAfter == 0 {
			if d, ok := parseRetryAfter(retryAfter, time.Now()); ok {
				serr.RetryAfter = min(d, h.maxRetryAfter)
				return kpar.Overloaded(kpar.RetryAfter(serr, serr.RetryAfter))
			}
		}
		err = kpar.Overloaded(serr)
	case c >= 300 && c <= 499 && c != http.StatusRequestTimeout:
		return kpar.Permanent(serr)
	}
	// 408, 5xx, and a 1xx as a final answer or a status outside HTTP's
	// range (a broken server or proxy, which may be fixed): retryable.
	if serr.RetryAfter > 0 {
		err = kpar.RetryAfter(err, serr.RetryAfter)
	}
	return err
}

// transportError classifies a request that got no answer. started is
// h.answered when it was sent.
//
//   - A certificate that does not verify is a *TLSError marked
//     kpar.Misconfigured: held and logged as a configuration error, never
//     dead-lettered (it is not the record's fault).
//   - A timeout (ctx's deadline: kpar's AttemptTimeout or Timeout; or the
//     client's own) is the endpoint not keeping up, kpar.Overloaded, so
//     that an endpoint that hangs burns no attempt while kpar backs off;
//     unless the endpoint answered another request 2xx meanwhile: then it
//     is this record that hangs it, and the attempt counts.
//   - ctx cancelled (kpar stopping the attempt), or a redirect that
//     cannot be followed: a plain error.
//   - Anything else (connection refused or reset): kpar.Overloaded, so
//     that an endpoint that is down is probed ever more slowly (kpar's
//     breaker, or kpar.AdaptiveConcurrency) instead of having every
//     record's attempts burnt and dead-lettered.
func (h *Handler) transportError(ctx context.Context, started uint64, err error) error {
	if tlsProblem(err) {
		return kpar.Misconfigured(&TLSError{Host: h.url.Host, Err: unwrapURLError(err)})
	}
	if errors.As(err, new(redirectError)) {
		return err // the endpoint answered: not an outage
	}
	if timedOut(ctx, err) {
		if h.answered.Load() != started {
			return err
		}
		return kpar.Overloaded(err)
	}
	if ctx.Err() != nil {
		return err
	}
	return kpar.Overloaded(err)
}

// redirectError is a 307 or 308 that cannot be followed: a loop, or a
// Location that is not http or https.
type redirectError struct{ error }

func (e redirectError) Unwrap() error { return e.error }

// timedOut reports whether a request failed for a deadline: its context's
// (DeadlineExceeded as the error or, for a batch, as the cause) or a
// transport timeout.
func timedOut(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(context.Cause(ctx), context.DeadlineExceeded)
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// unwrapURLError drops the *url.Error around a TLS error: TLSError.Error
// names the host itself.
func unwrapURLError(err error) error {
	for {
		u, ok := err.(interface{ Unwrap() error })
		if !ok || tlsOnly(err) {
			return err
		}
		err = u.Unwrap()
	}
}

// tlsOnly reports whether err is itself a TLS or x509 error, not a
// wrapper of one.
func tlsOnly(err error) bool {
	switch err.(type) {
	case *tls.CertificateVerificationError, x509.UnknownAuthorityError, x509.HostnameError,
		x509.CertificateInvalidError, tls.RecordHeaderError:
		return true
	}
	return false
}

// snippet reads the start of a failed response's body for its error.
func snippet(body io.Reader) string {
	buf := make([]byte, snippetLimit)
	n, _ := io.ReadFull(body, buf)
	return printable(buf[:n])
}

// printable turns b, the start of a response body or an endpoint's
// reason, into one line of text for an error and a dead letter's header:
// valid UTF-8, control characters and runs of space as one space, trimmed.
func printable(b []byte) string {
	var sb strings.Builder
	sb.Grow(len(b))
	space := false
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		b = b[size:]
		if unicode.IsSpace(r) || unicode.IsControl(r) {
			space = true
			continue
		}
		if space && sb.Len() > 0 {
			sb.WriteByte(' ')
		}
		space = false
		sb.WriteRune(r) // utf8.RuneError for an invalid byte
	}
	return sb.String()
}
