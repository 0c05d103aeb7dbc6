package doctest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/pgfence/pgfence/internal/gocmd"
)

// Command is one command of the pgfence CLI, as its --help output
// describes it.
type Command struct {
	Path      string              // "pgfence leases release"
	Flags     map[string]bool     // long flag names, without dashes, global ones included -> whether it takes a value
	Subs      map[string]*Command // subcommands by name
	TakesArgs bool                // its usage names arguments of its own (migrate up|down|version)
}

// BuildCLI builds the pgfence command from its directory under the module
// root into dir and returns the path of the binary. It builds from the
// command's directory so that this works whether or not the command is a
// module of its own.
func BuildCLI(root, dir string) (string, error) {
	bin := filepath.Join(dir, "pgfence")
	if _, err := goCmd(filepath.Join(root, "cmd", "pgfence"), "build", "-o", bin, "."); err != nil {
		return "", err
	}
	return bin, nil
}

// LoadCLI reads the command tree from the binary's --help output, command
// by command.
func LoadCLI(bin string) (*Command, error) {
	return loadCommand(bin, nil)
}

var (
	flagName    = regexp.MustCompile(`^\s+(?:-[a-zA-Z], )?--([a-z0-9][a-z0-9-]*)( [a-zA-Z0-9]+)?\s`)
	commandLine = regexp.MustCompile(`^\s+([a-z][a-z0-9-]*)\s`)
)

func loadCommand(bin string, path []string) (*Command, error) {
	cmd := exec.Command(bin, append(append([]string{}, path...), "--help")...)
	cmd.Env = append(os.Environ(), gocmd.QuickExit()) // built with -race under CI (goCmd)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("pgfence %s --help: %w: %s", strings.Join(path, " "), err, out)
	}
	c := &Command{Path: strings.Join(append([]string{"pgfence"}, path...), " "), Flags: map[string]bool{}, Subs: map[string]*Command{}}
	section := ""
	var subs []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		line := sc.Text()
		if line != "" && line[0] != ' ' {
			section = strings.TrimSuffix(line, ":")
			continue
		}
		switch section {
		case "Flags", "Global Flags":
			if m := flagName.FindStringSubmatch(line); m != nil {
				c.Flags[m[1]] = m[2] != ""
			}
		case "Usage":
			words := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), c.Path))
			for _, w := range words {
				if w != "[flags]" && w != "[command]" {
					c.TakesArgs = true
				}
			}
		case "Available Commands", "Additional Commands":
			if m := commandLine.FindStringSubmatch(line); m != nil && m[1] != "help" && m[1] != "completion" {
				subs = append(subs, m[1])
			}
		}
	}
	if len(c.Flags) == 0 {
		return nil, fmt.Errorf("%s --help lists no flags (not even --help): cannot read its output:\n%s", c.Path, out)
	}
	for _, s := range subs {
		sub, err := loadCommand(bin, append(append([]string{}, path...), s))
		if err != nil {
			return nil, err
		}
		c.Subs[s] = sub
	}
	// help and completion are cobra's own; accept them without reading them.
	for _, s := range []string{"help", "completion"} {
		if _, ok := c.Subs[s]; !ok && len(path) == 0 {
			c.Subs[s] = &Command{Path: "pgfence " + s, Flags: map[string]bool{"help": false}, Subs: map[string]*Command{}, TakesArgs: true}
		}
	}
	return c, nil
}

// Invocation is one pgfence command line found in a shell block.
type Invocation struct {
	Pos   string
	Words []string // after "pgfence"
}

// Invocations finds the pgfence commands in a shell block: commands whose
// first word (after environment assignments) is pgfence or
// "go run ./cmd/pgfence".
func Invocations(b Block) []Invocation {
	var invs []Invocation
	for _, line := range commandLines(b) {
		for _, cmd := range shellCommands(line.Text) {
			words := cmd
			for len(words) > 0 && isAssignment(words[0]) {
				words = words[1:]
			}
			switch {
			case len(words) > 0 && words[0] == "pgfence":
				words = words[1:]
			case len(words) > 2 && words[0] == "go" && words[1] == "run" && strings.TrimSuffix(words[2], "/") == "./cmd/pgfence":
				words = words[3:]
			default:
				continue
			}
			invs = append(invs, Invocation{Pos: b.Pos(line.N), Words: words})
		}
	}
	return invs
}

// ShellLangs are the block languages read as shell.
var ShellLangs = map[string]bool{"sh": true, "bash": true, "shell": true, "console": true, "cron": true}

// commandLines returns the command lines of a shell block, N being the
// offset of each from the block's first line: lines ending in a backslash
// are joined with the next; in a console block only "$ " lines count (the
// rest is output), and in a cron block the schedule is dropped.
func commandLines(b Block) []Line {
	var out []Line
	lines := strings.Split(b.Text, "\n")
	for i := 0; i < len(lines); i++ {
		start := i
		line := lines[i]
		for strings.HasSuffix(line, "\\") && i+1 < len(lines) {
			i++
			line = strings.TrimSuffix(line, "\\") + " " + lines[i]
		}
		switch b.Lang {
		case "console":
			rest, ok := strings.CutPrefix(line, "$ ")
			if !ok {
				continue
			}
			line = rest
		case "cron":
			f := strings.Fields(line)
			switch {
			case len(f) == 0 || strings.HasPrefix(f[0], "#"):
				continue
			case strings.HasPrefix(f[0], "@"):
				line = strings.Join(f[1:], " ")
			case len(f) > 5:
				line = strings.Join(f[5:], " ")
			default:
				continue
			}
		}
		out = append(out, Line{N: start, Text: line})
	}
	return out
}

var assignment = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

func isAssignment(w string) bool { return assignment.MatchString(w) }

// shellCommands splits a line into simple commands and those into words:
// enough of the shell for documentation (quotes, comments, the operators
// ; | || && & ( ) < >), with brackets of usage synopses ([--flag]) dropped.
func shellCommands(line string) [][]string {
	var cmds [][]string
	var words []string
	var w strings.Builder
	inWord := false
	flushWord := func() {
		if inWord {
			words = append(words, strings.Trim(w.String(), "[]"))
			w.Reset()
			inWord = false
		}
	}
	flushCmd := func() {
		flushWord()
		if len(words) > 0 {
			cmds = append(cmds, words)
		}
		words = nil
	}
	for i := 0; i < len(line); i++ {
		ch := line[i]
		switch {
		case ch == '\'' || ch == '"':
			j := strings.IndexByte(line[i+1:], ch)
			if j < 0 {
				j = len(line) - i - 1
			}
			w.WriteString(line[i+1 : i+1+j])
			inWord = true
			i += j + 1
		case ch == '#' && !inWord:
			flushCmd()
			return cmds
		case ch == ' ' || ch == '\t':
			flushWord()
		case strings.IndexByte(";|&()<>", ch) >= 0:
			if ch == '>' || ch == '<' { // a redirection's target is not a word of the command
				flushWord()
				for i+1 < len(line) && (line[i+1] == '>' || line[i+1] == '&' || line[i+1] == ' ') {
					i++
				}
				for i+1 < len(line) && line[i+1] != ' ' {
					i++
				}
				continue
			}
			flushCmd()
		default:
			w.WriteByte(ch)
			inWord = true
		}
	}
	flushCmd()
	return cmds
}

// CheckInvocation returns what is wrong with inv against the CLI: an
// unknown subcommand, or a flag the command does not have. Arguments after
// "--" belong to the command pgfence runs and are not checked.
func (c *Command) CheckInvocation(inv Invocation) []error {
	var errs []error
	cur := c
	descending := true
	for i := 0; i < len(inv.Words); i++ {
		w := inv.Words[i]
		if w == "--" {
			break
		}
		if strings.HasPrefix(w, "--") {
			name, _, hasValue := strings.Cut(strings.TrimPrefix(w, "--"), "=")
			takesValue, ok := cur.Flags[name]
			if !ok {
				errs = append(errs, fmt.Errorf("%s: %s has no flag --%s", inv.Pos, cur.Path, name))
			}
			if takesValue && !hasValue {
				i++ // its value
			}
			continue
		}
		if strings.HasPrefix(w, "-") {
			continue
		}
		if !descending {
			continue
		}
		if sub, ok := cur.Subs[w]; ok {
			cur = sub
			continue
		}
		if len(cur.Subs) > 0 && !cur.TakesArgs {
			errs = append(errs, fmt.Errorf("%s: %s has no subcommand %q", inv.Pos, cur.Path, w))
		}
		descending = false
	}
	return errs
}
