// Command cloudevents is an endpoint for `kpar forward --cloudevents`
// written with the CloudEvents Go SDK, the way a receiver written for
// Knative or Dapr looks: each record arrives as a CloudEvent in binary
// mode (ce-* headers, the record's value as the data).
//
//	go run . &   # listens on 127.0.0.1:8080 (PORT to change)
//	kpar forward --brokers 127.0.0.1:9092 --group g --topic orders \
//	  --url http://127.0.0.1:8080/ --cloudevents --content-type application/json
//
// The event's id, <topic>/<partition>/<offset>, is the record's
// idempotency key: kpar delivers at least once.
package main

import (
	"cmp"
	"context"
	"fmt"
	"log"
	"net/http"
	"os"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/protocol"
)

func main() {
	h, err := receiver(context.Background(), func(e cloudevents.Event) protocol.Result {
		fmt.Printf("%s %s from %s, subject %q: %s\n", e.ID(), e.Type(), e.Source(), e.Subject(), e.Data())
		return cloudevents.ResultACK
	})
	if err != nil {
		log.Fatal(err)
	}
	addr := "127.0.0.1:" + cmp.Or(os.Getenv("PORT"), "8080")
	log.Printf("listening on http://%s/", addr)
	log.Fatal(http.ListenAndServe(addr, h))
}

// receiver is the SDK's HTTP handler: it reads each request as an event
// (answering 400 to one that is not valid) and hands it to handle.
func receiver(ctx context.Context, handle func(cloudevents.Event) protocol.Result) (http.Handler, error) {
	p, err := cloudevents.NewHTTP()
	if err != nil {
		return nil, err
	}
	return cloudevents.NewHTTPReceiveHandler(ctx, p, handle)
}
