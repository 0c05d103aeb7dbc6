package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

const completionLong = `Print a shell completion script for pgfence, for bash, zsh or fish. The
scripts complete commands and flags by asking pgfence itself, so they stay
right across upgrades.

  bash (needs the bash-completion package):
    pgfence completion bash > /etc/bash_completion.d/pgfence
    or, for the current shell only: source <(pgfence completion bash)
  zsh (with compinit enabled):
    pgfence completion zsh > "${fpath[1]}/_pgfence"
  fish:
    pgfence completion fish > ~/.config/fish/completions/pgfence.fish

Start a new shell afterwards.`

func newCompletionCmd() *cobra.Command {
	shells := []string{"bash", "zsh", "fish"}
	return &cobra.Command{
		Use:       "completion bash|zsh|fish",
		Short:     "Print a shell completion script",
		Long:      completionLong,
		ValidArgs: shells,
		Args: argsUsage(func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return fmt.Errorf("completion needs one shell: bash, zsh or fish")
			}
			return cobra.OnlyValidArgs(cmd, args)
		}),
		RunE: action(func(cmd *cobra.Command, args []string) error {
			root, w := cmd.Root(), cmd.OutOrStdout()
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(w, true)
			case "zsh":
				return root.GenZshCompletion(w)
			default: // fish; Args allows nothing else
				return root.GenFishCompletion(w, true)
			}
		}),
	}
}
