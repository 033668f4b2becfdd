package kpar

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/internal/progress"
	"github.com/kpar/kpar/internal/window"
)

// rangeSource reads a fixed range for Backfill: one reader per slice, each
// a client assigned to its partition at the slice's progress, delivering
// into the slice's own partState (keyed by tp.slice). It settles by saving
// the progress file.
type rangeSource struct {
	e     *engine
	topic string
	file  string // progress file; "" for none
	// state is the progress as saved; the settler goroutine owns it, and
	// close once the settler stopped.
	state       *progress.State
	slices      []*rangeSlice // one per state.Slices entry, index for index
	alreadyDone int64
	// unsaved: state moved since the last successful save; saveErr is
	// the last save's error, read by Backfill once run returned. Both
	// belong to the settler, as state does.
	unsaved bool
	saveErr error
}

// rangeSlice is one reader's slice.
type rangeSlice struct {
	progress.Slice // as of the start: Done is where the reader begins
	ps             *partState
	cl             *kgo.Client // the reader's; closed by close
	// readDone: the reader reached the slice's end. Guarded by engine.mu.
	readDone bool
}

func newRangeSource(e *engine, topic, file string, state *progress.State) *rangeSource {
	r := &rangeSource{e: e, topic: topic, file: file, state: state}
	for i, s := range state.Slices {
		r.alreadyDone += s.Done - s.From
		sl := &rangeSlice{Slice: s, readDone: s.Done >= s.To}
		sl.ps = &partState{
			tp:        tp{topic: topic, partition: s.Partition, slice: int32(i)},
			win:       window.New(e.cfg.windowRecords),
			committed: -1,
			resumeAt:  -1,
		}
		r.slices = append(r.slices, sl)
	}
	return r
}

// open creates the readers' clients and hands the slices to the pipeline.
func (r *rangeSource) open(context.Context) error {
	e := r.e
	readers := 0
	for _, sl := range r.slices {
		if !sl.readDone {
			readers++
		}
	}
	for _, sl := range r.slices {
		if sl.readDone {
			continue
		}
		opts := append(e.cfg.backfillClientOpts(readers),
			kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{r.topic: {sl.Partition: kgo.NewOffset().At(sl.Done)}}),
			// An offset deleted under us must fail loudly, not restart the
			// slice from wherever the log starts now.
			kgo.ConsumeResetOffset(kgo.NoResetOffset()),
			// Transaction markers take offsets too: seeing them tells the
			// reader it passed its end when the last offsets are markers.
			kgo.KeepControlRecords(),
		)
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			r.closeClients()
			return fmt.Errorf("kpar: creating the client of a backfill reader: %w", err)
		}
		sl.cl = cl
	}
	e.mu.Lock()
	for _, sl := range r.slices {
		if !sl.readDone {
			e.parts[sl.ps.tp] = sl.ps
		}
	}
	e.mu.Unlock()
	e.log.Info("kpar: backfill starting", "topic", r.topic, "slices", len(r.slices),
		"to_read", readers, "already_done_offsets", r.alreadyDone, "concurrency", e.cfg.concurrency)
	return nil
}

// deliver runs the readers until every slice is read and every record of
// it finished, ctx ends, or a reader fails for good.
func (r *rangeSource) deliver(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var readers sync.WaitGroup
	errs := make(chan error, len(r.slices))
	for _, sl := range r.slices {
		if sl.cl == nil {
			continue
		}
		readers.Go(func() {
			if err := r.read(ctx, sl); err != nil {
				errs <- err
				cancel()
			}
		})
	}
	readers.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	if ctx.Err() != nil {
		return nil
	}
	// Everything is read: the range is done once its records finished.
	select {
	case <-r.e.whenIdle():
	case <-ctx.Done():
	}
	return nil
}

// read is the reader of one slice: it polls the slice's client and
// accepts the slice's records until it reaches the slice's end or the
// partition's high watermark.
func (r *rangeSource) read(ctx context.Context, sl *rangeSlice) error {
	e := r.e
	flog := &fetchErrorLog{log: e.log}
	next := sl.Done // the offset after the last one seen
	var recs []*kgo.Record
	for {
		if !e.waitForBytes(ctx) {
			return nil
		}
		fs := sl.cl.PollFetches(ctx)
		if ctx.Err() != nil || fs.IsClientClosed() {
			return nil
		}
		var fatal error
		fs.EachError(func(topic string, p int32, err error) {
			switch {
			case errors.Is(err, context.Canceled):
			case errors.Is(err, kerr.OffsetOutOfRange):
				fatal = fmt.Errorf("kpar: backfill of %s partition %d: offset %d is no longer in the log (deleted by retention?): %w", topic, p, next, err)
			case isFatal(err), errors.Is(err, kerr.UnknownTopicOrPartition):
				fatal = fmt.Errorf("kpar: backfill of %s partition %d: %w", topic, p, err)
			default:
				flog.Warn("kpar: backfill fetch error", "topic", topic, "partition", p, "err", err)
			}
		})
		if fatal != nil {
			return fatal
		}
		end := false
		var hwm int64 = -1
		recs = recs[:0]
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			hwm = max(hwm, p.HighWatermark)
			for _, rec := range p.Records {
				if end || rec.Offset < next {
					continue
				}
				if rec.Offset >= sl.To {
					end = true
					continue
				}
				next = rec.Offset + 1
				if !rec.Attrs.IsControl() {
					recs = append(recs, rec)
				}
				end = next >= sl.To
			}
		})
		if !end && hwm >= 0 && next >= hwm {
			// The partition ends below the slice's end: offsets that do
			// not exist are not waited for.
			e.log.Warn("kpar: backfill slice ends at the high watermark, below its end", "topic", r.topic,
				"partition", sl.Partition, "high_watermark", hwm, "slice_end", sl.To)
			end = true
		}
		if len(recs) > 0 {
			// The pipeline keeps the slice; the next poll gets a new one.
			batch := recs
			recs = nil
			meta := e.prepare(batch)
			e.mu.Lock()
			e.acceptWithin(sl.ps, batch, meta, len(batch))
			e.mu.Unlock()
		}
		if end {
			e.mu.Lock()
			sl.readDone = true
			e.askCommit() // the slice may be complete: save it
			e.mu.Unlock()
			return nil
		}
	}
}

// doneLocked is the slice's progress now: every record below it is
// finished. Called with engine.mu held.
func (sl *rangeSlice) doneLocked() int64 {
	ps := sl.ps
	if sl.readDone && ps.win.Pending() == 0 && ps.held.Len() == 0 && ps.over.Len() == 0 {
		return sl.To
	}
	if off, ok := ps.win.Start(); ok {
		return off
	}
	return sl.Done
}

// settle saves the progress file, when there is one.
func (r *rangeSource) settle(context.Context) error {
	e := r.e
	e.mu.Lock()
	e.outcomes.Taken()
	for i, sl := range r.slices {
		if done := sl.doneLocked(); done != r.state.Slices[i].Done {
			r.state.Slices[i].Done, r.unsaved = done, true
		}
	}
	e.mu.Unlock()
	if r.file == "" || !r.unsaved {
		return nil
	}
	if err := progress.Save(r.file, r.state); err != nil {
		r.saveErr = fmt.Errorf("kpar: saving backfill progress to %s: %w", r.file, err)
		return r.saveErr
	}
	r.unsaved, r.saveErr = false, nil
	return nil
}

func (r *rangeSource) settleEvery() time.Duration { return r.e.cfg.progressInterval }

func (r *rangeSource) pause(ps *partState, paused bool) {
	cl := r.slices[ps.slice].cl
	parts := map[string][]int32{ps.topic: {ps.partition}}
	if paused {
		cl.PauseFetchPartitions(parts)
	} else {
		cl.ResumeFetchPartitions(parts)
	}
}

func (r *rangeSource) stopping() {}

// close saves the progress one last time and closes the readers' clients.
// A failed save is Backfill's error already (saveErr), not ErrFinalCommit.
func (r *rangeSource) close(ctx context.Context, deadline time.Time) error {
	_ = r.settle(ctx)
	r.closeClients()
	return nil
}

func (r *rangeSource) closeClients() {
	for _, sl := range r.slices {
		if sl.cl != nil {
			sl.cl.Close()
		}
	}
}
