// Command waldenctl is the admin CLI of a walden coordinator cluster. It
// speaks the gRPC admin API (walden.v1.Cluster) of any member, tries every
// endpoint before giving up and follows the leader hint of a not-leader
// answer.
//
// Every command lives in its own file and registers itself on the root
// command in an init function; client.go holds what they share (endpoints,
// TLS, timeout, output format).
package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

// commands are the constructors of the top-level commands, added by init
// functions of the command files.
var commands []func(*cli) *cobra.Command

func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	c := &cli{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "waldenctl",
		Short: "waldenctl: admin CLI of a walden coordinator cluster",
		Long: `waldenctl talks to the admin API (gRPC) of walden coordinators.

It tries the endpoints in order until one answers, and follows the leader
hint when a member answers that it is not the leader.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return c.complete(cmd)
		},
	}
	c.bindFlags(root)
	for _, newCmd := range commands {
		root.AddCommand(newCmd(c))
	}
	return root
}

// run executes waldenctl with args and returns the process exit code.
func run(args []string, stdout, stderr io.Writer) int {
	root := newRootCmd(stdout, stderr)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.Execute(); err != nil {
		msg := strings.Join(strings.Fields(err.Error()), " ") // exactly one line
		fmt.Fprintf(stderr, "waldenctl: %s\n", msg)
		return 1
	}
	return 0
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}
