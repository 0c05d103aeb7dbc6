package integration_test

import (
	"fmt"
	"reflect"
	"slices"
	"syscall"
	"testing"
	"time"
)

// faults drives worker processes that wait for the command "go" at a point
// of interest (inside a hold, inside a period): it kills one of them there,
// stops another there, and resumes the frozen one when its test says.
type faults struct {
	t       *testing.T
	victim  *worker // SIGKILLed
	killed  event   // the victim's last event
	sleeper *worker // SIGSTOPped, then resumed
	frozen  event   // the sleeper's event when stopped
	resumed bool
}

// drive reads the events of ws until each of them has reported "done" or
// been killed, giving every other event, with its worker, to on. It fails
// the test if they are not done within 3 minutes, or no worker was frozen.
func (f *faults) drive(ws []*worker, on func(w *worker, ev event)) {
	t := f.t
	t.Helper()
	listening := slices.Clone(ws)
	timeout := time.After(3 * time.Minute)
	for len(listening) > 0 {
		i, ev := nextEvent(t, listening, timeout, fmt.Sprintf("workers not done within 3m (killed %v, frozen %v, resumed %v)",
			f.victim != nil, f.sleeper != nil, f.resumed))
		w := listening[i]
		if ev.Ev != "done" {
			on(w, ev)
		}
		if ev.Ev == "done" || w == f.victim {
			listening = slices.Delete(listening, i, i+1)
		}
	}
	if f.sleeper == nil {
		t.Fatal("the workers were done before one was frozen")
	}
	if !f.resumed {
		t.Errorf("%s, frozen, was not resumed before the others were done", f.sleeper.id)
		f.sleeper.kill(syscall.SIGCONT)
	}
}

// kill SIGKILLs w, which reported ev (where it is: "inside period 3"),
// and waits for it to exit.
func (f *faults) kill(w *worker, ev event, where string) {
	f.t.Helper()
	f.victim, f.killed = w, ev
	w.kill(syscall.SIGKILL)
	_ = w.exitErr()
	f.t.Logf("SIGKILLed %s %s (fence %d)", w.id, where, ev.Fence)
}

// stop SIGSTOPs w, which reported ev (where it is).
func (f *faults) stop(w *worker, ev event, where string) {
	f.t.Helper()
	f.sleeper, f.frozen = w, ev
	w.kill(syscall.SIGSTOP)
	f.t.Logf("SIGSTOPped %s %s (fence %d)", w.id, where, ev.Fence)
}

// resume lets the frozen worker go on, for the reason why.
func (f *faults) resume(why string) {
	f.t.Helper()
	f.resumed = true
	f.sleeper.kill(syscall.SIGCONT)
	f.sleeper.send("go")
	f.t.Logf("%s: resumed %s", why, f.sleeper.id)
}

// nextEvent returns the next event of any worker of ws, with the worker's
// index, and keeps it in that worker's seen. It fails the test with
// expired once timeout fires, when a worker exits, and on an "error" event.
func nextEvent(t *testing.T, ws []*worker, timeout <-chan time.Time, expired string) (int, event) {
	t.Helper()
	cases := make([]reflect.SelectCase, len(ws)+1)
	for i, w := range ws {
		cases[i] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(w.events)}
	}
	cases[len(ws)] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(timeout)}
	i, v, ok := reflect.Select(cases)
	if i == len(ws) {
		t.Fatal(expired)
	}
	if !ok {
		t.Fatalf("worker %s exited: %v\n%s", ws[i].id, ws[i].exitErr(), ws[i].log())
	}
	ev := v.Interface().(event)
	ws[i].seen = append(ws[i].seen, ev)
	if ev.Ev == "error" {
		t.Fatalf("worker %s failed: %s", ws[i].id, ev.Err)
	}
	return i, ev
}
