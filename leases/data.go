package leases

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Data with a lease: a grant may carry a small JSON value that anyone can
// read (Get, List, Observe, HeldError, `pgfence leases ls`) and that only
// the grant itself can replace — etcd's Proclaim, Chubby's "the leader
// publishes its address". It lives in the lease row (pgfence.leases.metadata)
// and ends with the grant: the next grant starts with its own data, or none.

// MaxDataLen is the largest data a grant may carry: bytes of compact JSON
// text. Larger values are rejected before anything is sent (ErrInvalid), and
// PostgreSQL enforces the same bound (pgfence.check_data).
const MaxDataLen = 1024

// AcquireOption configures one grant: Acquire, TryAcquire, Run and Lead
// take them after their other arguments. An invalid one makes the call
// return an error wrapping ErrInvalid, having written nothing.
type AcquireOption func(*acquireConfig) error

type acquireConfig struct {
	data json.RawMessage // compact JSON; nil: none
}

// WithData attaches data, a JSON value of at most MaxDataLen bytes once
// compacted that jsonb can store (UTF-8, no \u0000 escape, no lone
// surrogate escape, no number beyond PostgreSQL's numeric: 1e131072,
// 1e-16384), to the grant, written in the same statement that grants it
// (no extra round trip). It is what others see as Info.Data while the
// grant lasts; Lease.SetData replaces it. Default: none (NULL).
func WithData(data json.RawMessage) AcquireOption {
	return func(c *acquireConfig) error {
		d, err := compactData(data)
		if err != nil {
			return err
		}
		c.data = d
		return nil
	}
}

// acquireOptions applies opts.
func acquireOptions(opts []AcquireOption) (acquireConfig, error) {
	var cfg acquireConfig
	for _, opt := range opts {
		if opt == nil {
			return cfg, invalid("leases: acquire option must not be nil")
		}
		if err := opt(&cfg); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

// compactData validates data as JSON within MaxDataLen bytes and returns
// it compacted (nil for nil).
func compactData(data json.RawMessage) (json.RawMessage, error) {
	if data == nil {
		return nil, nil
	}
	var b bytes.Buffer
	if err := json.Compact(&b, data); err != nil {
		return nil, invalid(fmt.Sprintf("leases: data must be a JSON value: %v", err))
	}
	if b.Len() > MaxDataLen {
		return nil, invalid(fmt.Sprintf("leases: data must be at most %d bytes of JSON, got %d", MaxDataLen, b.Len()))
	}
	if err := storable(b.Bytes()); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// storable checks what encoding/json accepts and jsonb refuses, so that
// such data is bad input (ErrInvalid) rather than a database error that
// Lead would retry for ever: bytes that are not UTF-8 (22021), a \u0000
// escape (22P05) and a surrogate escape not in a high-low pair (22P02).
// data is valid, compact JSON.
func storable(data []byte) error {
	if !utf8.Valid(data) {
		return invalid("leases: data must be valid UTF-8")
	}
	inString := false
	for i := 0; i < len(data); i++ {
		switch {
		case !inString && (data[i] == '-' || '0' <= data[i] && data[i] <= '9'):
			j := i + 1
			for j < len(data) && strings.IndexByte("0123456789+-.eE", data[j]) >= 0 {
				j++
			}
			if !numericFits(string(data[i:j])) {
				return invalid(fmt.Sprintf("leases: data must not contain the number %.40s: PostgreSQL's numeric (jsonb's numbers) cannot store it", data[i:j]))
			}
			i = j - 1
		case data[i] == '"':
			inString = !inString
		case inString && data[i] == '\\':
			i++ // the escaped character
			if data[i] != 'u' {
				continue
			}
			r := hex4(data[i+1:])
			i += 4
			switch {
			case r == 0:
				return invalid(`leases: data must not contain \u0000: PostgreSQL's jsonb cannot store it`)
			case utf16.IsSurrogate(r) && r < 0xdc00 && i+6 < len(data) && data[i+1] == '\\' && data[i+2] == 'u':
				if low := hex4(data[i+3:]); low >= 0xdc00 && low <= 0xdfff {
					i += 6
					continue
				}
				fallthrough
			case utf16.IsSurrogate(r):
				return invalid(fmt.Sprintf(`leases: data must not contain a lone surrogate escape (\u%04x): PostgreSQL's jsonb cannot store it`, r))
			}
		}
	}
	return nil
}

// numericFits reports whether PostgreSQL's numeric, which jsonb stores
// numbers in, can store the JSON number num (valid JSON): at most 16383
// digits after the decimal point (counting those an exponent adds), a
// weight of at most 131071 decimal digits before it, and an exponent
// below 2^30-1 (INT_MAX/2) in magnitude even for zero. Beyond these the
// server refuses the value (22003, "value overflows numeric format");
// PostgreSQL 17 also stores a zero whose exponent is 2^30-1, which 15
// refuses, and numericFits refuses with 15.
func numericFits(num string) bool {
	mant, exp := strings.TrimPrefix(num, "-"), ""
	if k := strings.IndexAny(mant, "eE"); k >= 0 {
		mant, exp = mant[:k], mant[k+1:]
	}
	var e int64
	if exp != "" {
		neg := strings.HasPrefix(exp, "-")
		digits := strings.TrimLeft(strings.TrimLeft(exp, "+-"), "0")
		if len(digits) > 10 {
			return false
		}
		if digits != "" {
			e, _ = strconv.ParseInt(digits, 10, 64)
		}
		if e >= math.MaxInt32/2 {
			return false
		}
		if neg {
			e = -e
		}
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	if max(int64(len(frac))-e, 0) > 16383 { // the display scale
		return false
	}
	digits := intPart + frac
	k := strings.IndexFunc(digits, func(r rune) bool { return r != '0' })
	if k < 0 {
		return true // zero: no weight
	}
	return int64(len(intPart)-1-k)+e <= 131071 // the decimal weight
}

// hex4 is the value of the four hexadecimal digits that b starts with,
// as encoding/json has checked them.
func hex4(b []byte) rune {
	v, _ := strconv.ParseUint(string(b[:4]), 16, 16)
	return rune(v)
}

// dataArg is data as a statement parameter: NULL for none.
func dataArg(data json.RawMessage) any {
	if data == nil {
		return nil
	}
	return string(data)
}

// Data returns the data of this grant as this client last wrote it
// (WithData, SetData), compact; nil for none. A SetData that failed is not
// reflected, even if its update committed (see SetData).
func (l *Lease) Data() json.RawMessage {
	if l == nil {
		return nil
	}
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	return l.data
}

// SetData replaces the grant's data with data (nil removes it), waiting for
// row locks as long as ctx allows. Only this grant can: the statement names
// (name, owner, fence) and writes only while the grant is live by the
// database clock, so a holder that lost the lease — expired, force-released,
// taken over — writes nothing and gets an error wrapping ErrLost (the lease
// is then lost, as after a failed renewal). Waiters and observers of the
// lease are told (Observe reports the new data within about a round trip).
// Data that WithData refuses (not JSON, longer than MaxDataLen, or not
// storable by jsonb) returns an error wrapping ErrInvalid and writes
// nothing. After a database error the update may have landed all the same:
// one whose commit was under way when ctx ended or the connection broke —
// waiting for a synchronous standby, say — still commits, and Data() keeps
// the previous value until a later SetData succeeds; Get reads what is
// stored. Returns Err() if the lease is no longer held. Safe to repeat:
// after an error, repeat it to know what the grant carries.
func (l *Lease) SetData(ctx context.Context, data json.RawMessage) error {
	if l == nil || ctx == nil {
		return invalid("leases: set data: lease and context must not be nil")
	}
	d, err := compactData(data)
	if err != nil {
		return err
	}
	if err := l.heldErr(); err != nil {
		return err
	}
	if err := l.c.checkEncoding(ctx, "set data of", l.name, string(d)); err != nil {
		return err
	}
	var ok *bool
	err = l.c.q.QueryRow(ctx, sqlSetData, l.name, l.owner, l.fence, dataArg(d)).Scan(&ok)
	if err != nil {
		return dbError(fmt.Sprintf("set data of %q", l.name), err)
	}
	if ok == nil {
		lost := l.goneErr("set data of")
		l.c.lose(l, lostRenewRejected, lost, false)
		return l.Err() // lost, or released meanwhile
	}
	l.c.mu.Lock()
	l.data = d
	l.c.mu.Unlock()
	return nil
}
