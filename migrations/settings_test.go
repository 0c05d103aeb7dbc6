package migrations_test

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// TestUpDownUnderOddSessionSettings: an operator's role or database may
// set standard_conforming_strings off (backslashes in '...' are then
// escapes) and date, interval and number output styles other than the
// defaults. Every migration applies and reverts all the same: migration
// 4's DO blocks held the literal '\x00', which such a session read as a
// NUL character ("invalid byte sequence for encoding "UTF8": 0x00").
func TestUpDownUnderOddSessionSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	options := "-c standard_conforming_strings=off -c DateStyle=SQL,DMY -c IntervalStyle=sql_standard" +
		" -c TimeZone=Pacific/Chatham -c extra_float_digits=-15 -c bytea_output=escape"
	u := withParam(pgtest.EmptyURL(t), "options="+strings.ReplaceAll(url.QueryEscape(options), "+", "%20"))
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("Up: %v", err)
	}
	if err := migrations.Down(ctx, u); err != nil {
		t.Fatalf("Down: %v", err)
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("Up after Down: %v", err)
	}
}
