package route

import (
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/ext"
)

// The variables an expression may use (see the package documentation).
const (
	varKey       = "key"
	varValue     = "value"
	varHeaders   = "headers"
	varTopic     = "topic"
	varPartition = "partition"
	varOffset    = "offset"
	varTimestamp = "timestamp"
)

// newEnv is the CEL environment of every expression: the standard library,
// the string extensions and optional values (value.?f.orValue(x)), as in
// Kubernetes, and the record's variables.
func newEnv() (*cel.Env, error) {
	return cel.NewEnv(
		cel.Variable(varKey, cel.DynType),
		cel.Variable(varValue, cel.DynType),
		cel.Variable(varHeaders, cel.MapType(cel.StringType, cel.StringType)),
		cel.Variable(varTopic, cel.StringType),
		cel.Variable(varPartition, cel.IntType),
		cel.Variable(varOffset, cel.IntType),
		cel.Variable(varTimestamp, cel.TimestampType),
		cel.CrossTypeNumericComparisons(true),
		cel.OptionalTypes(),
		ext.Strings(),
	)
}

// CompileError is an expression that does not compile: a syntax error, a
// type error (an unknown variable or function, operands of the wrong
// types), or a result that is not a bool.
type CompileError struct {
	Rule   int    // the rule, from 1; 0 for the filter
	Expr   string // the expression as given
	Line   int    // of the first problem, from 1
	Column int    // of the first problem, from 1, in characters
	Msg    string // the first problem
	// Detail is every problem, each as line:column: message, then its
	// line of the expression and a caret under the position.
	Detail string
}

func (e *CompileError) Error() string {
	what := "filter"
	if e.Rule > 0 {
		what = fmt.Sprintf("rule %d", e.Rule)
	}
	// The detail shows the expression's line under the message.
	return fmt.Sprintf("route: %s: %s", what, e.Detail)
}

// program is one compiled expression and its counters.
type program struct {
	expr    string
	prg     cel.Program
	matched atomic.Uint64
	errors  atomic.Uint64
	lastErr atomic.Pointer[string] // the latest evaluation error's text
}

// compile parses and checks expr, the filter (n 0) or rule n.
func compile(env *cel.Env, expr string, n int) (*program, error) {
	src := common.NewTextSource(expr)
	whole := func(msg string) *CompileError {
		return &CompileError{Rule: n, Expr: expr, Line: 1, Column: 1, Msg: msg, Detail: "1:1: " + msg}
	}
	if strings.TrimSpace(expr) == "" {
		return nil, whole(`empty expression: want a bool expression such as value.type == "order"`)
	}
	ast, iss := env.CompileSource(src)
	if iss.Err() != nil {
		errs := iss.Errors()
		first := errs[0]
		var detail []string
		for _, e := range errs {
			e.Message = tidy(e.Message)
			detail = append(detail, strings.TrimPrefix(e.ToDisplayString(src), "ERROR: <input>:"))
		}
		return nil, &CompileError{
			Rule: n, Expr: expr,
			Line: first.Location.Line(), Column: first.Location.Column() + 1,
			Msg:    first.Message,
			Detail: strings.Join(detail, "\n"),
		}
	}
	if t := ast.OutputType(); !t.IsExactType(cel.BoolType) && !t.IsExactType(cel.DynType) {
		return nil, whole(fmt.Sprintf("the expression is of type %s; want a bool (true sends the record), such as a comparison", t))
	}
	prg, err := env.Program(ast, cel.EvalOptions(cel.OptOptimize))
	if err != nil {
		return nil, whole(err.Error())
	}
	return &program{expr: expr, prg: prg}, nil
}

// tidy drops what a message says about CEL containers, which route does
// not use.
func tidy(msg string) string { return strings.TrimSuffix(msg, " (in container '')") }

// eval evaluates p on a's record. An evaluation that fails, or gives a
// value that is not a bool, is false, and noted in a for the counts. The
// error returned is the Decoder's, when p needed the decoded record and it
// failed.
func (p *program) eval(a *activation) (bool, error) {
	out, _, err := p.prg.Eval(a)
	if a.decodeErr != nil {
		return false, a.decodeErr
	}
	if err != nil {
		a.fails = append(a.fails, failure{p, err.Error()})
		return false, nil
	}
	b, ok := out.(types.Bool)
	if !ok {
		a.fails = append(a.fails, failure{p, fmt.Sprintf("gave %s %v, not a bool", out.Type().TypeName(), out)})
		return false, nil
	}
	return bool(b), nil
}

// failure is an evaluation that failed on a record.
type failure struct {
	p   *program
	msg string
}

func (p *program) failed(msg string) {
	p.errors.Add(1)
	p.lastErr.Store(&msg)
}
