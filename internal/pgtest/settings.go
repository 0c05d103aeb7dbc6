package pgtest

import (
	"net/url"
	"strings"
)

// WithSettings returns databaseURL (a URL, not keyword/value form) with the
// given "name=value" settings added as its options ("-c name=value"), as a
// role's or database's defaults (ALTER ROLE ... SET) would set them for
// every session. A space inside a value is escaped with a backslash
// (`default_transaction_isolation=repeatable\ read`).
func WithSettings(databaseURL string, settings ...string) string {
	opts := "-c " + strings.Join(settings, " -c ")
	sep := "?"
	if strings.Contains(databaseURL, "?") {
		sep = "&"
	}
	return databaseURL + sep + "options=" + strings.ReplaceAll(url.QueryEscape(opts), "+", "%20")
}
