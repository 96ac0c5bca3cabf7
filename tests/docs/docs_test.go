// Package docs_test checks the repository's documentation: Go doc links in
// the library's doc comments name identifiers that exist, relative
// Markdown links in README.md, docs/ and the DESIGN.md files resolve, each
// public package has an Example that runs under go test, and (cost_test.go)
// measures the numbers README.md and docs/costs.md quote and fails when they
// quote others.
package docs_test

import (
	"fmt"
	"go/ast"
	"go/doc"
	"go/doc/comment"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"
)

// libraryPackages are the public packages of the root module, by directory.
var libraryPackages = []string{"store", "retry", "observe", "versioned", "lease", "deferred", "idempotency", "move"}

// root is the repository's root: the directory above holding go.work.
func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("..")
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, parent, dir, "no go.work above the test")
		dir = parent
	}
}

// pkgInfo is what a package declares: top-level names, and the methods and
// fields of each type.
type pkgInfo struct {
	name    string
	files   []*ast.File
	imports map[string]string // package name -> import path, from every file
	top     map[string]bool
	members map[string]map[string]bool // type -> method or field names
}

func parseDir(t *testing.T, dir string, tests bool) *pkgInfo {
	t.Helper()
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	p := &pkgInfo{imports: map[string]string{}, top: map[string]bool{}, members: map[string]map[string]bool{}}
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") != tests {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.ParseComments)
		require.NoError(t, err)
		if tests && !strings.HasSuffix(f.Name.Name, "_test") && !tests {
			continue
		}
		p.name = f.Name.Name
		p.files = append(p.files, f)
		for _, imp := range f.Imports {
			path := strings.Trim(imp.Path.Value, `"`)
			name := filepath.Base(path)
			if imp.Name != nil {
				name = imp.Name.Name
			}
			if strings.HasPrefix(name, "v") && len(name) <= 3 { // .../mongo-driver/v2/...: base is the package
				name = filepath.Base(filepath.Dir(path))
			}
			p.imports[name] = path
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					p.top[d.Name.Name] = true
					continue
				}
				typ := d.Recv.List[0].Type
				for {
					switch x := typ.(type) {
					case *ast.StarExpr:
						typ = x.X
						continue
					case *ast.IndexExpr:
						typ = x.X
						continue
					case *ast.IndexListExpr:
						typ = x.X
						continue
					}
					break
				}
				if id, ok := typ.(*ast.Ident); ok {
					p.member(id.Name, d.Name.Name)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						p.top[s.Name.Name] = true
						p.member(s.Name.Name, "")
						if st, ok := s.Type.(*ast.StructType); ok {
							for _, fld := range st.Fields.List {
								for _, n := range fld.Names {
									p.member(s.Name.Name, n.Name)
								}
								if len(fld.Names) == 0 { // embedded: its type's name
									if id, ok := fld.Type.(*ast.Ident); ok {
										p.member(s.Name.Name, id.Name)
									}
								}
							}
						}
						if it, ok := s.Type.(*ast.InterfaceType); ok {
							for _, m := range it.Methods.List {
								for _, n := range m.Names {
									p.member(s.Name.Name, n.Name)
								}
							}
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							p.top[n.Name] = true
						}
					}
				}
			}
		}
	}
	return p
}

func (p *pkgInfo) member(typ, name string) {
	if p.members[typ] == nil {
		p.members[typ] = map[string]bool{}
	}
	if name != "" {
		p.members[typ][name] = true
	}
}

// comments returns every doc comment of the package's files.
func (p *pkgInfo) comments() []*ast.CommentGroup {
	var out []*ast.CommentGroup
	for _, f := range p.files {
		if f.Doc != nil {
			out = append(out, f.Doc)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				if n.Doc != nil {
					out = append(out, n.Doc)
				}
			case *ast.GenDecl:
				if n.Doc != nil {
					out = append(out, n.Doc)
				}
			case *ast.TypeSpec:
				if n.Doc != nil {
					out = append(out, n.Doc)
				}
			case *ast.ValueSpec:
				if n.Doc != nil {
					out = append(out, n.Doc)
				}
			case *ast.Field:
				if n.Doc != nil {
					out = append(out, n.Doc)
				}
			}
			return true
		})
	}
	return out
}

// docLinks returns the doc links of a comment's text, every [Name] or
// [pkg.Name] or [Type.Name] treated as a link whatever it names.
func docLinks(text string, imports map[string]string) []*comment.DocLink {
	var links []*comment.DocLink
	p := &comment.Parser{
		LookupPackage: func(name string) (string, bool) {
			if path, ok := imports[name]; ok {
				return path, true
			}
			if slices.Contains(libraryPackages, name) || name == "mongotest" {
				return "github.com/mongocas/mongocas/" + name, true
			}
			return "", false
		},
		LookupSym: func(string, string) bool { return true },
	}
	var walk func(ts []comment.Text)
	walk = func(ts []comment.Text) {
		for _, x := range ts {
			switch x := x.(type) {
			case *comment.DocLink:
				links = append(links, x)
			case *comment.Link:
				walk(x.Text)
			case *comment.Italic, comment.Plain:
			}
		}
	}
	d := p.Parse(text)
	for _, b := range d.Content {
		switch b := b.(type) {
		case *comment.Paragraph:
			walk(b.Text)
		case *comment.Heading:
			walk(b.Text)
		case *comment.List:
			for _, it := range b.Items {
				for _, c := range it.Content {
					if para, ok := c.(*comment.Paragraph); ok {
						walk(para.Text)
					}
				}
			}
		}
	}
	return links
}

// TestDocLinks: every Go doc link in the library packages' doc comments
// names an identifier that exists (in the package, in another package of
// this repository, or, for the standard library and the driver, in a
// package the file imports), and every relative Markdown link in
// README.md, docs/*.md and the DESIGN.md files reaches a file of the
// repository and, with a #fragment, a heading of that file.
func TestDocLinks(t *testing.T) {
	t.Parallel()
	r := root(t)
	pkgs := map[string]*pkgInfo{} // import path -> info
	for _, dir := range append(slices.Clone(libraryPackages), "mongotest", "otelmongocas") {
		pkgs["github.com/mongocas/mongocas/"+dir] = parseDir(t, filepath.Join(r, dir), false)
	}
	var broken []string
	links := 0
	for path, p := range pkgs {
		for _, cg := range p.comments() {
			for _, l := range docLinks(cg.Text(), p.imports) {
				links++
				target := p
				if l.ImportPath != "" {
					target = pkgs[l.ImportPath]
					if target == nil { // the standard library or the driver: resolved by import
						continue
					}
				}
				var ok bool
				switch {
				case l.Recv != "":
					ok = target.members[l.Recv] != nil && target.members[l.Recv][l.Name]
				case l.Name != "":
					ok = target.top[l.Name]
				default:
					ok = true // [pkg] alone
				}
				if !ok {
					name := l.Name
					if l.Recv != "" {
						name = l.Recv + "." + l.Name
					}
					if l.ImportPath != "" {
						name = filepath.Base(l.ImportPath) + "." + name
					}
					broken = append(broken, fmt.Sprintf("%s: [%s] names nothing (in %q)", path, name, firstLine(cg.Text())))
				}
			}
		}
	}

	md := []string{filepath.Join(r, "README.md")}
	docs, err := filepath.Glob(filepath.Join(r, "docs", "*.md"))
	require.NoError(t, err)
	design, err := filepath.Glob(filepath.Join(r, "*", "DESIGN.md"))
	require.NoError(t, err)
	md = append(append(md, docs...), design...)
	mdLinks := 0
	for _, file := range md {
		src, err := os.ReadFile(file)
		require.NoError(t, err)
		rel, _ := filepath.Rel(r, file)
		for _, target := range markdownLinks(string(src)) {
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			mdLinks++
			path, frag, _ := strings.Cut(target, "#")
			dest := file
			if path != "" {
				dest = filepath.Clean(filepath.Join(filepath.Dir(file), path))
			}
			if inRepo, _ := filepath.Rel(r, dest); strings.HasPrefix(inRepo, "..") {
				broken = append(broken, fmt.Sprintf("%s: %s leaves the repository", rel, target))
				continue
			}
			if _, err := os.Stat(dest); err != nil {
				broken = append(broken, fmt.Sprintf("%s: %s: no such file", rel, target))
				continue
			}
			if frag != "" {
				body, err := os.ReadFile(dest)
				if err != nil || !slices.Contains(anchors(string(body)), frag) {
					broken = append(broken, fmt.Sprintf("%s: %s: no heading with that anchor", rel, target))
				}
			}
		}
	}
	t.Logf("%d Go doc links in the library's doc comments, %d relative links in %d Markdown files: %d broken", links, mdLinks, len(md), len(broken))
	require.Empty(t, broken)
	require.Positive(t, links)
	require.Positive(t, mdLinks)
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

var (
	fenced   = regexp.MustCompile("(?ms)^```.*?^```")
	codeSpan = regexp.MustCompile("`[^`\n]*`")
	mdLink   = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading  = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *#*$`)
)

// markdownLinks returns the targets of the inline links of a Markdown
// text, outside code blocks and code spans.
func markdownLinks(src string) []string {
	src = fenced.ReplaceAllString(src, "")
	src = codeSpan.ReplaceAllString(src, "")
	matches := mdLink.FindAllStringSubmatch(src, -1)
	out := make([]string, 0, len(matches))
	for _, m := range matches {
		out = append(out, m[1])
	}
	return out
}

// anchors returns the GitHub anchors of a Markdown text's headings.
func anchors(src string) []string {
	src = fenced.ReplaceAllString(src, "")
	var out []string
	seen := map[string]int{}
	for _, m := range heading.FindAllStringSubmatch(src, -1) {
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteByte('-')
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out = append(out, fmt.Sprintf("%s-%d", a, n))
		} else {
			out = append(out, a)
		}
		seen[a]++
	}
	return out
}

// TestExampleCounts prints the Example functions of each public package,
// found in the package's own directory (so `go doc` and pkg.go.dev show
// them) or, for one that needs what its module must not link (a server, an
// SDK), in the tests module's directory of the same name, and requires that
// at least one of them runs under go test (it has an "// Output:" comment)
// and, when that one is in the tests module, that the package documentation
// says so:
//
//	go test -count=1 -run ExampleCounts -v ./tests/docs
func TestExampleCounts(t *testing.T) {
	t.Parallel()
	r := root(t)
	for _, dir := range append(slices.Clone(libraryPackages), "mongotest", "otelmongocas") {
		own, ran := examples(t, filepath.Join(r, dir))
		elsewhere, ranElsewhere := examples(t, filepath.Join(r, "tests", dir))
		t.Logf("%-12s %2d Example functions, %d run (%s); in tests/%s: %d, %d run", dir, len(own), len(ran),
			strings.Join(ran, " "), dir, len(elsewhere), len(ranElsewhere))
		switch {
		case len(ran) > 0:
		case len(ranElsewhere) > 0:
			doc := parseDir(t, filepath.Join(r, dir), false)
			linked := false
			for _, cg := range doc.comments() {
				linked = linked || strings.Contains(cg.Text(), "tests/"+dir)
			}
			if !linked {
				t.Errorf("package %s: its running Examples are in tests/%s, and its documentation does not say so", dir, dir)
			}
		default:
			t.Errorf("package %s has no Example that runs under go test (one with an // Output: comment)", dir)
		}
	}
}

// examples returns the Example functions of the test files in dir (none
// when there is no such directory) and those of them that go test runs.
func examples(t *testing.T, dir string) (all, run []string) {
	t.Helper()
	if _, err := os.Stat(dir); err != nil {
		return nil, nil
	}
	p := parseDir(t, dir, true)
	for _, ex := range doc.Examples(p.files...) {
		name := "Example" + ex.Name // Name is "New_invalidType", or "_suffix" for a package example
		all = append(all, name)
		if ex.Output != "" || ex.EmptyOutput {
			run = append(run, name)
		}
	}
	slices.Sort(all)
	slices.Sort(run)
	return all, run
}
