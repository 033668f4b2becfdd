// Command go is an endpoint for `kpar forward`, in Go with net/http: one
// record per request on /records, a batch of records (kpar forward
// --batch N) on /batch.
//
//	go run ./examples/go   # listens on 127.0.0.1:8000 (PORT to change)
//	kpar forward --brokers 127.0.0.1:9092 --group g --topic orders \
//	  --content-type application/json --url http://127.0.0.1:8000/records
package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"sync"

	"github.com/kpar/kpar/forward"
)

var (
	mu   sync.Mutex
	done = map[string]bool{} // "topic/partition/offset" handled: kpar delivers at least once
)

// handle is your work; keep done with its results.
func handle(id string, order json.RawMessage) {
	mu.Lock()
	defer mu.Unlock()
	if !done[id] {
		fmt.Printf("processed %s %s\n", id, order)
		done[id] = true
	}
}

func main() {
	http.HandleFunc("POST /records", func(w http.ResponseWriter, r *http.Request) {
		order, _ := io.ReadAll(r.Body)
		if !json.Valid(order) { // a 4xx is dead-lettered at once, with this text
			http.Error(w, "the value is not JSON", http.StatusUnprocessableEntity)
			return
		}
		handle(r.Header.Get("Kpar-Topic")+"/"+r.Header.Get("Kpar-Partition")+"/"+r.Header.Get("Kpar-Offset"), order)
	})
	http.HandleFunc("POST /batch", func(w http.ResponseWriter, r *http.Request) {
		var batch []forward.BatchRecord
		if err := json.NewDecoder(r.Body).Decode(&batch); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		answers := make([]forward.BatchAnswer, len(batch)) // one per record, in order
		for i, rec := range batch {
			answers[i].Status = http.StatusOK
			if !json.Valid(rec.Value) { // "error" goes to the record's dead letter
				answers[i] = forward.BatchAnswer{Status: http.StatusUnprocessableEntity, Error: "the value is not JSON"}
				continue
			}
			handle(fmt.Sprintf("%s/%d/%d", rec.Topic, rec.Partition, rec.Offset), rec.Value)
		}
		json.NewEncoder(w).Encode(answers)
	})
	log.Fatal(http.ListenAndServe("127.0.0.1:"+cmp.Or(os.Getenv("PORT"), "8000"), nil))
}
