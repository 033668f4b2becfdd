package main

import (
	"crypto/tls"
	"net/http"
	"time"

	"github.com/kpar/kpar/forward"
)

// requestFlags shape the HTTP requests of kpar forward and kpar backfill
// alike: the same endpoint code serves both (docs/http-contract.md).
type requestFlags struct {
	headers     listFlag
	headerFile  *string
	urlCA       *string
	contentType *string
	cloudEvents *bool
	ceSource    *string
	ceType      *string
	batch       *int
	batchWait   *time.Duration
	// extra is the headers of --header and --header-file, once opts read
	// them.
	extra http.Header
}

func addRequestFlags(fs *flagSet) *requestFlags {
	rf := &requestFlags{}
	fs.Var(&rf.headers, "header", "add the header `'Name: value'` to every request; repeatable (KPAR_HEADER: one per line)")
	rf.headerFile = fs.String("header-file", "", "add the headers in `FILE`, one 'Name: value' per line (# comments), to every request: for secrets")
	rf.urlCA = fs.String("url-ca", "", "verify an https --url against the PEM CA certificates in `FILE` instead of the system's")
	rf.contentType = fs.String("content-type", forward.DefaultContentType, "the Content-Type of requests whose record has no content-type header of its own (which wins), `TYPE`; application/json for JSON records")
	rf.cloudEvents = fs.Bool("cloudevents", false, "send each record as a CloudEvent in binary mode: ce-* headers, the value as the body (excludes --batch)")
	rf.ceSource = fs.String("ce-source", forward.DefaultCloudEventsSource, "with --cloudevents, the ce-source of records without a ce_source header, `URI`; {topic} stands for the record's topic")
	rf.ceType = fs.String("ce-type", forward.DefaultCloudEventsType, "with --cloudevents, the ce-type of records without a ce_type header")
	rf.batch = fs.Int("batch", 1, "send up to `N` records per request, as a JSON array (1: one record per request, the value as the body)")
	rf.batchWait = fs.Duration("batch-wait", 5*time.Millisecond, "with --batch, send a batch that is not full this long after its first record")
	return rf
}

// check validates the flags (exit 2 with a usage error otherwise).
func (rf *requestFlags) check(fs *flagSet) (code int, ok bool) {
	switch {
	case *rf.batch < 1 || *rf.batch > 1<<14:
		return fs.usageError("invalid --batch %d: want 1 to 16384", *rf.batch), false
	case *rf.batch > 1 && *rf.batchWait <= 0:
		return fs.usageError("invalid --batch-wait %v: want more than 0", *rf.batchWait), false
	case *rf.batch > 1 && *rf.cloudEvents:
		return fs.usageError("invalid --batch with --cloudevents: a CloudEvent in binary mode is one record per request"), false
	case !*rf.cloudEvents && (fs.given("ce-source") || fs.given("ce-type")):
		return fs.usageError("invalid --ce-source/--ce-type: they need --cloudevents"), false
	}
	return 0, true
}

// opts are the forward options the flags ask for, after base.
func (rf *requestFlags) opts(fs *flagSet, base ...forward.Opt) ([]forward.Opt, int, bool) {
	extra, err := requestHeaders(rf.headers.split("\n"), *rf.headerFile)
	if err != nil {
		return nil, fs.usageError("%v", err), false
	}
	if code, ok := contentTypeFlag(fs, rf.contentType, extra); !ok {
		return nil, code, false
	}
	rf.extra = extra
	opts := append(base, forward.Header(extra), forward.Batch(*rf.batch, *rf.batchWait), forward.ContentType(*rf.contentType))
	if *rf.cloudEvents {
		opts = append(opts, forward.CloudEvents(*rf.ceSource, *rf.ceType))
	}
	if *rf.urlCA != "" {
		pool, err := readCAs(*rf.urlCA)
		if err != nil {
			return nil, fs.usageError("invalid --url-ca: %v", err), false
		}
		opts = append(opts, forward.TLSConfig(&tls.Config{RootCAs: pool}))
	}
	return opts, 0, true
}
