package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// human renders d rounded for reading: 950ms, 12s, 4m05s, 3h02m, 2d04h.
func human(d time.Duration) string {
	if d < 0 {
		d = -d
	}
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		d = d.Round(time.Second)
		return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	case d < 48*time.Hour:
		d = d.Round(time.Minute)
		return fmt.Sprintf("%dh%02dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	default:
		d = d.Round(time.Hour)
		return fmt.Sprintf("%dd%02dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
	}
}

// writeJSON writes v as indented JSON followed by a newline.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write JSON: %w", err)
	}
	return nil
}

// orDash returns s, or "-" when s is empty, for table cells.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// display returns s for an operator's terminal: as it is when every
// character prints, and Go-quoted otherwise (or when it begins with a
// quote, so that the two forms cannot be confused). Lease names, owners and
// data are any client's text; a newline, a tab or an escape sequence in one
// would forge a row of a table or drive the terminal. --json output needs
// no such care: JSON escapes them.
func display(s string) string {
	if strings.HasPrefix(s, `"`) || !printable(s) {
		return strconv.Quote(s)
	}
	return s
}

// printable reports whether every character of s prints (a space being
// the only blank).
func printable(s string) bool {
	return strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) || r == unicode.ReplacementChar }) < 0
}

// shellArg returns s as one shell word, for a command that a message
// suggests: as is when every byte is plainly safe, else single-quoted,
// or, when s has a character that does not print (a line break, an
// escape sequence), as $'...' with that character escaped, so that the
// suggestion neither reaches the terminal raw nor runs anything pasted.
// A word that starts with '-' gets "-- " before it, so that it is not
// taken for a flag.
func shellArg(s string) string {
	word := shellWord(s)
	if strings.HasPrefix(s, "-") {
		return "-- " + word
	}
	return word
}

func shellWord(s string) string {
	safe := s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r < utf8.RuneSelf && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_-./:@%+=,#", r)))
	}) < 0
	switch {
	case safe && !strings.HasPrefix(s, "#"):
		return s
	case printable(s):
		return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
	}
	var b strings.Builder
	b.WriteString("$'")
	for _, r := range s {
		switch {
		case r == '\\' || r == '\'':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == utf8.RuneError || !unicode.IsPrint(r) && r != ' ':
			var buf [utf8.UTFMax]byte
			for _, c := range buf[:utf8.EncodeRune(buf[:], r)] {
				fmt.Fprintf(&b, `\x%02x`, c)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('\'')
	return b.String()
}
