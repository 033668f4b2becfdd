package main

import (
	"context"
	"fmt"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"
)

// produce produces the demo's records and waits for their acknowledgement.
func (d *demo) produce(ctx context.Context, cl *kgo.Client) error {
	failed := make(chan error, 1)
	for i := range d.records {
		key, seq := i%d.keys, i/d.keys
		r := &kgo.Record{
			Topic: demoTopic,
			Key:   []byte("key-" + strconv.Itoa(key)),
			Value: fmt.Appendf(nil, "key=%d seq=%d", key, seq),
		}
		cl.Produce(ctx, r, func(r *kgo.Record, err error) {
			if err != nil {
				select {
				case failed <- err:
				default:
				}
				return
			}
			d.ledger.Produced(r)
			d.produced.Add(1)
		})
		select {
		case err := <-failed:
			return err
		default:
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	select {
	case err := <-failed:
		return err
	default:
		return nil
	}
}
