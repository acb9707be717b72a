package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"walden/version"
)

func init() { rootCmd.AddCommand(newVersionCmd()) }

func newVersionCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit and Go version of this binary",
		Long: `version prints the release and commit this binary was built from (stamped by
the Makefile, or recorded by the Go toolchain for a plain go build) and the Go
version that built it. -o json prints {"version","commit","go_version"}.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return printVersion(cmd, "walden", output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

func printVersion(cmd *cobra.Command, name, output string) error {
	info := version.Get()
	switch output {
	case "json":
		return printJSON(cmd, info)
	case "table":
		_, err := fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", name, info)
		return err
	default:
		return fmt.Errorf("--output: must be table or json, got %q", output)
	}
}

// printJSON writes v as indented JSON to the command's output.
func printJSON(cmd *cobra.Command, v any) error {
	enc := json.NewEncoder(cmd.OutOrStdout())
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
