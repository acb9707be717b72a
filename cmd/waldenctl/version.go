package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"walden/version"
)

func init() { commands = append(commands, newVersionCmd) }

func newVersionCmd(c *cli) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit and Go version of waldenctl",
		Long: `version prints the release and commit waldenctl was built from and the Go
version that built it; it contacts no member. -o json prints
{"version","commit","go_version"}. The members' versions are on their
/metrics (walden_build_info).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info := version.Get()
			if c.output == "json" {
				enc := json.NewEncoder(c.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(info)
			}
			_, err := fmt.Fprintf(c.stdout, "waldenctl %s\n", info)
			return err
		},
	}
}
