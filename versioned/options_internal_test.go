package versioned

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/retry"
)

// optionSamples calls each WriteOption constructor of the package with
// arguments that make it set something. A constructor missing here fails
// TestEveryWriteOptionDecidesCombining.
var optionSamples = map[string]WriteOption{
	"Where":     Where(bson.D{{Key: "status", Value: "open"}}),
	"WhereErr":  WhereErr(bson.D{{Key: "status", Value: "open"}}, ErrConflict),
	"WithSet":   WithSet(bson.E{Key: "stamp", Value: 1}),
	"WithRetry": WithRetry(retry.Policy{MaxAttempts: 2}),
}

// Every field of writeConfig is declared once in writeFields, with whether
// a Modify call that sets it may share a combined write; every exported
// WriteOption constructor sets only declared fields, each of which its
// declaration sees as set. So an option added without a decision fails
// here, instead of combining silently and running with the leader's
// settings.
func TestEveryWriteOptionDecidesCombining(t *testing.T) {
	typ := reflect.TypeFor[writeConfig]()
	fields := make([]string, 0, typ.NumField())
	for i := range typ.NumField() {
		fields = append(fields, typ.Field(i).Name)
	}
	declared := make([]string, 0, len(writeFields))
	for _, f := range writeFields {
		declared = append(declared, f.name)
	}
	slices.Sort(fields)
	slices.Sort(declared)
	if !slices.Equal(fields, declared) {
		t.Fatalf("writeConfig has fields %v, writeFields declares %v: declare each field once, with whether it combines", fields, declared)
	}
	var zero writeConfig
	if zero.alone() || !zero.piped() {
		t.Fatal("a call without options must combine, and take the pipeline form")
	}

	ctors := writeOptionConstructors(t)
	names := make([]string, 0, len(optionSamples))
	for name := range optionSamples {
		names = append(names, name)
	}
	slices.Sort(names)
	if !slices.Equal(ctors, names) {
		t.Fatalf("the package's WriteOption constructors are %v, optionSamples covers %v", ctors, names)
	}
	for _, name := range names {
		var c writeConfig
		optionSamples[name](&c)
		v := reflect.ValueOf(c)
		touched := 0
		for i := range v.NumField() {
			if v.Field(i).IsZero() {
				continue
			}
			touched++
			fname := typ.Field(i).Name
			j := slices.IndexFunc(writeFields, func(f writeField) bool { return f.name == fname })
			if !writeFields[j].set(&c) {
				t.Errorf("%s sets writeConfig.%s, which writeFields' declaration does not see as set", name, fname)
			}
		}
		if touched == 0 {
			t.Errorf("%s sets no field of writeConfig", name)
		}
	}
	// The decisions Modify's doc states: a call with these takes its turn
	// alone.
	for _, name := range []string{"Where", "WhereErr", "WithSet", "WithRetry"} {
		var c writeConfig
		optionSamples[name](&c)
		if !c.alone() {
			t.Errorf("a Modify call with %s must take its turn alone", name)
		}
	}
}

// writeOptionConstructors returns the exported functions of the package
// (its non-test files) that return a WriteOption, sorted.
func writeOptionConstructors(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), e.Name(), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !fn.Name.IsExported() || fn.Type.Results == nil || len(fn.Type.Results.List) != 1 {
				continue
			}
			if id, ok := fn.Type.Results.List[0].Type.(*ast.Ident); ok && id.Name == "WriteOption" {
				out = append(out, fn.Name.Name)
			}
		}
	}
	slices.Sort(out)
	return out
}
