package doctest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// Doc is one Markdown file, split into fenced code blocks and the prose
// between them.
type Doc struct {
	Path   string // as given to Load: relative to the repository root
	Blocks []Block
	Prose  []Line // lines outside fenced blocks
}

// Line is one line of a Doc with its 1-based line number.
type Line struct {
	N    int
	Text string
}

// Block is one fenced code block.
type Block struct {
	Doc        string // the file's path
	Line       int    // line of the first content line
	Lang       string // first word of the info string, lower-cased
	Text       string // content, with the fence's indentation removed
	NotChecked string // reason given by a preceding <!-- not-checked: … -->, if any
}

// Pos is where a block (or a line in it) is, for messages.
func (b Block) Pos(offset int) string { return fmt.Sprintf("%s:%d", b.Doc, b.Line+offset) }

var notChecked = regexp.MustCompile(`^<!--\s*not-checked:\s*(.*?)\s*-->$`)

// LoadAll reads README.md and docs/*.md under root.
func LoadAll(root string) ([]*Doc, error) {
	paths := []string{"README.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	sort.Strings(more)
	for _, p := range more {
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return nil, err
		}
		paths = append(paths, filepath.ToSlash(rel))
	}
	var docs []*Doc
	for _, p := range paths {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(p)))
		if err != nil {
			return nil, err
		}
		d, err := Parse(p, string(b))
		if err != nil {
			return nil, err
		}
		docs = append(docs, d)
	}
	return docs, nil
}

// Parse splits Markdown text into fenced blocks (``` or ~~~, possibly
// indented, as in list items) and prose. An unclosed fence is an error: it
// would silently swallow the rest of the file.
func Parse(path, text string) (*Doc, error) {
	d := &Doc{Path: path}
	lines := strings.Split(text, "\n")
	lastProse := "" // last non-blank prose line, for the opt-out comment
	for i := 0; i < len(lines); i++ {
		trimmed := strings.TrimLeft(lines[i], " ")
		indent := len(lines[i]) - len(trimmed)
		fence := fenceOf(trimmed)
		if fence == "" {
			d.Prose = append(d.Prose, Line{N: i + 1, Text: lines[i]})
			if t := strings.TrimSpace(lines[i]); t != "" {
				lastProse = t
			}
			continue
		}
		b := Block{Doc: path, Line: i + 2, Lang: strings.ToLower(firstWord(strings.TrimPrefix(trimmed, fence)))}
		if m := notChecked.FindStringSubmatch(lastProse); m != nil {
			if m[1] == "" {
				return nil, fmt.Errorf("%s:%d: not-checked needs a reason", path, i)
			}
			b.NotChecked = m[1]
		}
		var body []string
		closed := false
		for i++; i < len(lines); i++ {
			t := strings.TrimLeft(lines[i], " ")
			if strings.HasPrefix(t, fence) && strings.Trim(t, fence[:1]) == "" {
				closed = true
				break
			}
			l := lines[i]
			if len(l)-len(strings.TrimLeft(l, " ")) >= indent {
				l = l[indent:]
			} else {
				l = strings.TrimLeft(l, " ")
			}
			body = append(body, l)
		}
		if !closed {
			return nil, fmt.Errorf("%s:%d: code block is never closed", path, b.Line-1)
		}
		b.Text = strings.Join(body, "\n") + "\n"
		d.Blocks = append(d.Blocks, b)
		lastProse = ""
	}
	return d, nil
}

// fenceOf returns the opening fence (``` or ~~~, or longer) that line starts
// with, or "".
func fenceOf(line string) string {
	for _, c := range []string{"`", "~"} {
		n := len(line) - len(strings.TrimLeft(line, c))
		if n >= 3 {
			return line[:n]
		}
	}
	return ""
}

func firstWord(s string) string {
	f := strings.Fields(strings.Trim(s, "{}"))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}
