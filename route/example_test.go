package route_test

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/route"
)

// Orders over 100 go to one handler, other orders to another, and the rest
// is filtered; in kpar forward each handler is a forward.Handler per URL.
func Example() {
	say := func(what string) kpar.Handler {
		return kpar.HandlerFunc(func(_ context.Context, r *kgo.Record) error {
			fmt.Printf("offset %d: %s\n", r.Offset, what)
			return nil
		})
	}
	h, err := route.New([]route.Rule{
		{Expr: `value.type == "order" && value.amount > 100`, Handler: say("big order")},
		{Expr: `value.type == "order"`, Handler: say("order")},
	}, nil, route.ContentType("application/json"))
	if err != nil {
		panic(err)
	}
	for i, v := range []string{`{"type":"order","amount":250}`, `{"type":"order","amount":20}`, `{"type":"refund"}`} {
		h.Handle(context.Background(), &kgo.Record{Offset: int64(i), Value: []byte(v)})
	}
	fmt.Println("filtered:", h.Stats().Filtered)
	// Output:
	// offset 0: big order
	// offset 1: order
	// filtered: 1
}

// A syntax or type error names the position.
func ExampleCompileError() {
	_, err := route.New(nil, nil, route.Filter(`value.amount > 100 && topc == "orders"`))
	fmt.Println(err)
	// Output:
	// route: filter: 1:23: undeclared reference to 'topc'
	//  | value.amount > 100 && topc == "orders"
	//  | ......................^
}
