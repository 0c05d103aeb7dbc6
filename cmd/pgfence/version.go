package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/pgfence/pgfence/migrations"
)

// versionInfo is what pgfence version prints.
type versionInfo struct {
	Version       string `json:"version"`            // the module version, "(devel)" for a local build
	Revision      string `json:"revision,omitempty"` // the VCS commit, when the build recorded it
	Modified      bool   `json:"modified,omitempty"` // built from a tree with uncommitted changes
	SchemaVersion uint   `json:"schema_version"`     // the migration version this binary expects
	Go            string `json:"go"`
	Platform      string `json:"platform"`
}

func newVersionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print pgfence's version and the schema version it expects",
		Long: `Print the version of this pgfence binary (the module version it was built
from: go install github.com/pgfence/pgfence/cmd/pgfence@latest records it;
"(devel)" for a build from a checkout), the schema version it expects
(the highest migration embedded in it, which 'pgfence migrate up' applies),
and the Go version and platform it was built with.

'pgfence migrate version' shows the schema version a database has.`,
		Args: argsUsage(cobra.NoArgs),
		RunE: action(func(cmd *cobra.Command, _ []string) error {
			v, err := buildVersion()
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if asJSON {
				return writeJSON(w, v)
			}
			rev := ""
			if v.Revision != "" {
				rev = " (" + v.Revision
				if v.Modified {
					rev += ", modified"
				}
				rev += ")"
			}
			fmt.Fprintf(w, "pgfence %s%s\nschema version %d\n%s %s\n", v.Version, rev, v.SchemaVersion, v.Go, v.Platform)
			return nil
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of text")
	return cmd
}

// buildVersion reads the version this binary was built with.
func buildVersion() (versionInfo, error) {
	schema, err := migrations.Latest()
	if err != nil {
		return versionInfo{}, err
	}
	v := versionInfo{Version: "(devel)", SchemaVersion: schema, Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v, nil // built without module support
	}
	if bi.Main.Version != "" {
		v.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v, nil
}
