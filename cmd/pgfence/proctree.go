package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER (linux/prctl.h).
const prSetChildSubreaper = 36

// becomeSubreaper makes orphaned descendants of this process its children
// instead of init's, so that every process the command starts stays in
// this process's tree, whatever process group or session it moves to.
func becomeSubreaper() error {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		return errno
	}
	return nil
}

// descendants lists the live processes below pid, read from /proc. With
// pid a subreaper that is every process its children started, also those
// in another process group or session. A process whose main thread has
// exited while others run is live.
func descendants(pid int) []int {
	dirs, _ := filepath.Glob("/proc/[0-9]*") // the pattern is valid
	children := map[int][]int{}
	for _, d := range dirs {
		child, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		if ppid, ok := parentOf(d); ok {
			children[ppid] = append(children[ppid], child)
		}
	}
	var out []int
	for next := children[pid]; len(next) > 0; {
		p := next[0]
		next = append(next[1:], children[p]...)
		out = append(out, p)
	}
	return out
}

// parentOf reads the parent pid from dir/stat: the field after the state,
// which follows the command name in parentheses (which may hold anything).
func parentOf(dir string) (int, bool) {
	b, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return 0, false // exited meanwhile
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 2 || string(f[0]) == "Z" && !liveThreads(dir) {
		return 0, false // zombies are reaped, not killed
	}
	ppid, err := strconv.Atoi(string(f[1]))
	return ppid, err == nil
}

// liveThreads reports whether the process at dir, whose state says it is a
// zombie, has threads left: its main thread has exited (pthread_exit in a
// C program's main) but the process lives on, with its children, until
// the others end. It is no zombie to reap: wait4 does not report it until
// then, so it must be counted and killed as any other process.
func liveThreads(dir string) bool {
	tasks, err := os.ReadDir(dir + "/task")
	return err == nil && len(tasks) > 1
}
