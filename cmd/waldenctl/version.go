package main

import (
	"fmt"
	"io"

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
			return c.printValue(info, func(w io.Writer) {
				fmt.Fprintf(w, "waldenctl %s\n", info)
			})
		},
	}
}
