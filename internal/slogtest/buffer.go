package slogtest

import (
	"bytes"
	"sync"
)

// Buffer is a log destination safe for concurrent use: pass it to
// slog.NewTextHandler or slog.NewJSONHandler and read what was written
// with String.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
