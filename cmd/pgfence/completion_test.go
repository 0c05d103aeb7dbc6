package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Each shell's script comes out, and a bad or missing shell is a usage
// error.
func TestCompletionScripts(t *testing.T) {
	t.Parallel()
	for shell, want := range map[string]string{
		"bash": "complete -o default -F __start_pgfence pgfence",
		"zsh":  "#compdef pgfence",
		"fish": "complete -c pgfence ",
	} {
		r := cli(t, cliEnv(), "completion", shell)
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Errorf("completion %s: exit %d, script without %q", shell, r.code, want)
		}
	}
	for _, args := range [][]string{{"completion"}, {"completion", "tcsh"}, {"completion", "bash", "zsh"}} {
		if r := cli(t, cliEnv(), args...); r.code != exitUsage {
			t.Errorf("%v: exit %d, want %d", args, r.code, exitUsage)
		}
	}
}

// bashCompletion is the bash-completion package's library, which the bash
// script needs (as it says in completion --help).
const bashCompletion = "/usr/share/bash-completion/bash_completion"

// The bash script completes commands and flags by asking pgfence, in a
// real bash with bash-completion, and never offers the hidden reaper.
func TestCompletionInBash(t *testing.T) {
	t.Parallel()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatalf("bash is needed for this test: %v", err)
	}
	if _, err := os.Stat(bashCompletion); err != nil {
		t.Fatalf("the bash-completion package is needed for this test (apt-get install bash-completion): %v", err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// A "pgfence" on PATH that is this test binary acting as the CLI: the
	// script runs the command the user typed.
	bin := t.TempDir()
	wrapper := "#!/bin/sh\n" + envCLI + "=1 exec '" + self + "' \"$@\"\n"
	if err := os.WriteFile(filepath.Join(bin, "pgfence"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	complete := func(line string) []string {
		t.Helper()
		script := `source ` + bashCompletion + ` && source <(pgfence completion bash) || exit 1
read -ra COMP_WORDS <<< "$LINE"
[[ $LINE == *' ' ]] && COMP_WORDS+=('')
COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
COMP_LINE=$LINE COMP_POINT=${#LINE}
__start_pgfence
printf '%s\n' "${COMPREPLY[@]}"`
		cmd := exec.Command(bash, "--noprofile", "--norc", "-c", script)
		cmd.Env = append(cliEnv("PATH="+bin+":"+os.Getenv("PATH")), "LINE="+line)
		// stderr has compopt's complaint that no completion is running.
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("completing %q: %v", line, err)
		}
		got := strings.Fields(string(out))
		slices.Sort(got)
		return got
	}
	if got := complete("pgfence le"); !slices.Equal(got, []string{"leases"}) {
		t.Errorf(`"pgfence le" completes to %q, want leases`, got)
	}
	if got := complete("pgfence "); !slices.Contains(got, "run") || !slices.Contains(got, "version") || slices.Contains(got, reaperName) {
		t.Errorf(`"pgfence " completes to %q: want run and version, not %s`, got, reaperName)
	}
	if got := complete("pgfence run --gr"); !slices.Equal(got, []string{"--grace"}) {
		t.Errorf(`"pgfence run --gr" completes to %q, want --grace`, got)
	}
	if got := complete("pgfence completion "); !slices.Equal(got, []string{"bash", "fish", "zsh"}) {
		t.Errorf(`"pgfence completion " completes to %q, want bash fish zsh`, got)
	}
}
