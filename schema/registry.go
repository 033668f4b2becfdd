package schema

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/kpar/kpar"
)

// Registry is a Schema Registry client (franz-go's pkg/sr) with a bounded
// cache of compiled schemas by ID. It is safe for concurrent use.
type Registry struct {
	cl       *sr.Client
	hc       *http.Client
	url      string // redacted, for messages
	max      int
	validate bool

	mu       sync.Mutex               // guards the maps
	byID     map[int]*compiled        // compiled schemas, at most max
	byGUID   map[string]int           // GUID to ID, at most max
	inflight map[int]*fetch           // fetches under way, by ID
	latest   map[string]subjectSchema // SUBJECT or SUBJECT:VERSION for replies
}

type fetch struct {
	done chan struct{}
	c    *compiled
	err  error
}

// Opt configures a Registry.
type Opt interface{ apply(*cfg) }

type opt func(*cfg)

func (o opt) apply(c *cfg) { o(c) }

type cfg struct {
	user, pass string
	token      string
	tls        *tls.Config
	cacheSize  int
	timeout    time.Duration
	validate   bool
}

func defaultCfg() cfg { return cfg{cacheSize: 1000, timeout: 10 * time.Second} }

// BasicAuth authenticates to the registry with a user and password
// (Confluent Cloud: an API key and secret). Default: none.
func BasicAuth(user, pass string) Opt { return opt(func(c *cfg) { c.user, c.pass = user, pass }) }

// BearerToken authenticates to the registry with a bearer token. Default:
// none.
func BearerToken(token string) Opt { return opt(func(c *cfg) { c.token = token }) }

// TLSConfig sets the TLS configuration for an https registry (RootCAs for
// a private CA), overriding Go's default.
func TLSConfig(t *tls.Config) Opt { return opt(func(c *cfg) { c.tls = t }) }

// CacheSize bounds the compiled schemas kept by ID, overriding the default
// 1000. A schema evicted is fetched again when a record needs it.
func CacheSize(n int) Opt { return opt(func(c *cfg) { c.cacheSize = n }) }

// Timeout bounds one registry request, overriding the default 10s; a
// timeout is an overload (the record waits and burns no attempt).
func Timeout(d time.Duration) Opt { return opt(func(c *cfg) { c.timeout = d }) }

// Validate checks JSON Schema values against their schema when decoding
// them and replies when encoding them; default off: a JSON Schema value
// is sent as written.
func Validate() Opt { return opt(func(c *cfg) { c.validate = true }) }

// New returns a client of the registry at rawURL.
func New(rawURL string, opts ...Opt) (*Registry, error) {
	c := defaultCfg()
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	u, err := url.Parse(rawURL)
	switch {
	case err != nil:
		return nil, fmt.Errorf("schema registry URL: %w", err)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("schema registry URL %q: scheme must be http or https", u.Redacted())
	case u.Host == "":
		return nil, fmt.Errorf("schema registry URL %q has no host", u.Redacted())
	case c.cacheSize < 1:
		return nil, fmt.Errorf("schema: CacheSize(%d) out of range: want 1 or more", c.cacheSize)
	case c.user != "" && c.token != "":
		return nil, errors.New("schema: give BasicAuth or BearerToken, not both")
	}
	if pw, ok := u.User.Password(); ok && c.user == "" {
		c.user, c.pass = u.User.Username(), pw
	}
	u.User = nil
	t := http.DefaultTransport.(*http.Transport).Clone()
	if c.tls != nil {
		t.TLSClientConfig = c.tls.Clone()
	}
	hc := &http.Client{Transport: t, Timeout: c.timeout}
	srOpts := []sr.ClientOpt{
		sr.URLs(u.String()),
		sr.HTTPClient(hc),
		sr.UserAgent("kpar"),
	}
	switch {
	case c.user != "":
		srOpts = append(srOpts, sr.BasicAuth(c.user, c.pass))
	case c.token != "":
		srOpts = append(srOpts, sr.BearerToken(c.token))
	}
	cl, err := sr.NewClient(srOpts...)
	if err != nil {
		return nil, fmt.Errorf("schema registry: %w", err)
	}
	return &Registry{
		cl: cl, hc: hc, url: u.String(), max: c.cacheSize, validate: c.validate,
		byID: make(map[int]*compiled), byGUID: make(map[string]int),
		inflight: make(map[int]*fetch), latest: make(map[string]subjectSchema),
	}, nil
}

// Close closes the client's idle connections to the registry.
func (r *Registry) Close() { r.hc.CloseIdleConnections() }

// URL is the registry's URL, without credentials.
func (r *Registry) URL() string { return r.url }

// Check asks the registry for its subjects, to fail early on a wrong URL
// or credentials.
func (r *Registry) Check(ctx context.Context) error {
	if _, err := r.cl.Subjects(ctx); err != nil {
		return r.classify(err, "listing subjects")
	}
	return nil
}

// classify turns a registry error into the record's outcome: a schema the
// registry does not know is permanent (the record is dead-lettered);
// anything else (unreachable, 5xx, 429, a timeout, refused credentials)
// is an overload that holds the record without burning an attempt.
func (r *Registry) classify(err error, what string) error {
	var re *sr.ResponseError
	if errors.As(err, &re) {
		if re.StatusCode == http.StatusNotFound {
			return kpar.Permanent(fmt.Errorf("schema not found: %s (registry %s: %s)", what, r.url, re.Error()))
		}
		msg := fmt.Sprintf("schema registry %s answered %d to %s: %s", r.url, re.StatusCode, what, re.Error())
		if re.StatusCode == http.StatusUnauthorized || re.StatusCode == http.StatusForbidden {
			msg += " (check the registry credentials)"
		}
		return kpar.Overloaded(errors.New(msg))
	}
	return kpar.Overloaded(fmt.Errorf("schema registry %s unreachable (%s): %w", r.url, what, err))
}

// byRef returns the compiled schema of ref.
func (r *Registry) byRef(ctx context.Context, rf ref) (*compiled, error) {
	if rf.guid == "" {
		return r.schema(ctx, rf.id)
	}
	r.mu.Lock()
	id, ok := r.byGUID[rf.guid]
	r.mu.Unlock()
	if !ok {
		ss, err := r.cl.SchemaByGUID(ctx, rf.guid)
		if err != nil {
			return nil, r.classify(err, fmt.Sprintf("schema %s (magic byte 1: a schema GUID, which registries before Confluent 8 do not serve)", rf))
		}
		id = ss.ID
		r.mu.Lock()
		if len(r.byGUID) >= r.max {
			for k := range r.byGUID {
				delete(r.byGUID, k)
				break
			}
		}
		r.byGUID[rf.guid] = id
		r.mu.Unlock()
	}
	return r.schema(ctx, id)
}

// schema returns the compiled schema of id, fetching it once for all the
// records that wait for it.
func (r *Registry) schema(ctx context.Context, id int) (*compiled, error) {
	r.mu.Lock()
	if c, ok := r.byID[id]; ok {
		r.mu.Unlock()
		return c, nil
	}
	f, waiting := r.inflight[id]
	if !waiting {
		f = &fetch{done: make(chan struct{})}
		r.inflight[id] = f
	}
	r.mu.Unlock()
	if waiting {
		select {
		case <-f.done:
			return f.c, f.err
		case <-ctx.Done():
			return nil, kpar.Overloaded(fmt.Errorf("schema registry %s: waiting for schema ID %d: %w", r.url, id, ctx.Err()))
		}
	}
	f.c, f.err = r.load(ctx, id)
	r.mu.Lock()
	delete(r.inflight, id)
	if f.err == nil {
		if len(r.byID) >= r.max {
			for k := range r.byID { // an arbitrary one: map order is random
				delete(r.byID, k)
				break
			}
		}
		r.byID[id] = f.c
	}
	r.mu.Unlock()
	close(f.done)
	return f.c, f.err
}

// load fetches schema id and its references and compiles them.
func (r *Registry) load(ctx context.Context, id int) (*compiled, error) {
	s, err := r.cl.SchemaByID(ctx, id)
	if err != nil {
		return nil, r.classify(err, fmt.Sprintf("schema ID %d", id))
	}
	refs, err := r.references(ctx, s.References, map[string]bool{})
	if err != nil {
		return nil, err
	}
	c, err := compile(id, s, refs)
	if err != nil {
		return nil, kpar.Permanent(fmt.Errorf("schema ID %d does not compile: %w", id, err))
	}
	return c, nil
}

// reference is a schema that another references, by the name it uses.
type reference struct {
	name   string
	schema sr.Schema
}

// references fetches rs and what they reference in turn, dependencies
// first.
func (r *Registry) references(ctx context.Context, rs []sr.SchemaReference, seen map[string]bool) ([]reference, error) {
	var out []reference
	for _, rf := range rs {
		key := fmt.Sprintf("%s/%d", rf.Subject, rf.Version)
		if seen[key] {
			continue
		}
		seen[key] = true
		if len(seen) > 256 {
			return nil, kpar.Permanent(errors.New("schema references: more than 256"))
		}
		ss, err := r.cl.SchemaByVersion(ctx, rf.Subject, rf.Version)
		if err != nil {
			return nil, r.classify(err, fmt.Sprintf("referenced schema %s version %d", rf.Subject, rf.Version))
		}
		deps, err := r.references(ctx, ss.References, seen)
		if err != nil {
			return nil, err
		}
		out = append(out, deps...)
		out = append(out, reference{rf.Name, ss.Schema})
	}
	return out, nil
}

// subjectSchema is a subject's schema for replies.
type subjectSchema struct {
	c *compiled
}

// bySubject returns the compiled schema of subject at version (-1: the
// latest), cached for the Registry's life.
func (r *Registry) bySubject(ctx context.Context, subject string, version int) (*compiled, error) {
	key := fmt.Sprintf("%s:%d", subject, version)
	r.mu.Lock()
	s, ok := r.latest[key]
	r.mu.Unlock()
	if ok {
		return s.c, nil
	}
	ss, err := r.cl.SchemaByVersion(ctx, subject, version)
	if err != nil {
		what := fmt.Sprintf("subject %s version %d", subject, version)
		if version == -1 {
			what = fmt.Sprintf("subject %s (latest version)", subject)
		}
		return nil, r.classify(err, what)
	}
	c, err := r.schema(ctx, ss.ID)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.latest[key] = subjectSchema{c}
	r.mu.Unlock()
	return c, nil
}
