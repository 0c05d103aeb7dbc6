// Package slogtest has log destinations for tests: a Buffer safe for
// concurrent use, and handlers that misbehave as an application's might,
// for tests of what the libraries do then.
package slogtest

import (
	"context"
	"log/slog"
	"strings"
	"sync"
)

// Stalling is a slog.Handler whose Handle blocks, for records whose
// message contains a given text, until Release: a log sink that stalls (a
// full pipe, a slow network shipper). Other records are dropped.
type Stalling struct {
	match   string
	stalled chan struct{}
	release chan struct{}
	once    sync.Once
	rel     sync.Once
}

// NewStalling returns a handler that stalls on records whose message
// contains match.
func NewStalling(match string) *Stalling {
	return &Stalling{match: match, stalled: make(chan struct{}), release: make(chan struct{})}
}

// Stalled is closed when a matching record first blocks.
func (h *Stalling) Stalled() <-chan struct{} { return h.stalled }

// Release lets every blocked and later record through. It may be called
// more than once.
func (h *Stalling) Release() { h.rel.Do(func() { close(h.release) }) }

// Enabled reports true for every level.
func (h *Stalling) Enabled(context.Context, slog.Level) bool { return true }

// WithAttrs returns h.
func (h *Stalling) WithAttrs([]slog.Attr) slog.Handler { return h }

// WithGroup returns h.
func (h *Stalling) WithGroup(string) slog.Handler { return h }

// Handle blocks until Release if r's message contains the text.
func (h *Stalling) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.match) {
		h.once.Do(func() { close(h.stalled) })
		<-h.release
	}
	return nil
}
