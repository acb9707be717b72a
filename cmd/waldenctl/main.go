package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// commands are the constructors of the top-level commands, added by init
// functions of the command files.
var commands []func(*cli) *cobra.Command

func newRootCmd(stdout, stderr io.Writer) (*cobra.Command, *cli) {
	c := &cli{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "waldenctl",
		Short: "waldenctl: admin CLI of a walden coordinator cluster",
		Long: `waldenctl talks to the admin API (gRPC) of walden coordinators.

It tries the endpoints in order until one answers, and follows the leader
hint when a member answers that it is not the leader.

Every global flag can also be set in the environment: WALDENCTL_ and the
flag's name in capitals (WALDENCTL_ENDPOINTS, WALDENCTL_CACERT,
WALDENCTL_CERT, WALDENCTL_KEY, WALDENCTL_TIMEOUT, WALDENCTL_OUTPUT); a flag
on the command line wins. Shell completion: waldenctl completion bash|zsh|fish.

` + exitHelp(),
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := c.complete(cmd); err != nil {
				return usageErr(err)
			}
			return nil
		},
	}
	c.bindFlags(root)
	root.SuggestionsMinimumDistance = 2
	root.SetFlagErrorFunc(flagError)
	for _, newCmd := range commands {
		root.AddCommand(newCmd(c))
	}
	markUsage(root)
	return root, c
}

// run executes waldenctl with args and returns the process exit code.
func run(args []string, stdout, stderr io.Writer) int {
	root, c := newRootCmd(stdout, stderr)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.Execute(); err != nil {
		code := exitCode(err)
		reportError(stderr, err, code, c.structured() || asksStructured(args))
		return code
	}
	return exitOK
}

// asksStructured reports whether args ask for -o json or yaml, for an
// error found before the flags were parsed (an unknown command or flag).
func asksStructured(args []string) bool {
	for i, a := range args {
		v, ok := "", false
		switch {
		case a == "-o" || a == "--output":
			if i+1 < len(args) {
				v, ok = args[i+1], true
			}
		case strings.HasPrefix(a, "--output="):
			v, ok = strings.TrimPrefix(a, "--output="), true
		case strings.HasPrefix(a, "-o") && len(a) > 2:
			v, ok = strings.TrimPrefix(strings.TrimPrefix(a, "-o"), "="), true
		}
		if ok && (v == outJSON || v == outYAML) {
			return true
		}
	}
	return false
}

// markUsage makes the argument checks of cmd and its subcommands return
// usage errors (exit status 2).
func markUsage(cmd *cobra.Command) {
	if check := cmd.Args; check != nil {
		cmd.Args = func(cmd *cobra.Command, args []string) error {
			if err := check(cmd, args); err != nil {
				return usageErr(err)
			}
			return nil
		}
	}
	for _, sub := range cmd.Commands() {
		markUsage(sub)
	}
}

// reportError prints err on one line, and its suggestion (a typo's likely
// meaning, or how to check a request that got no answer) on a line of its
// own; with -o json or yaml, it is printed as a JSON object instead, with
// the exit status, and for a refused call its gRPC code and reason.
func reportError(stderr io.Writer, err error, code int, structured bool) {
	var ce *callError
	if !errors.As(err, &ce) {
		ce = &callError{Message: err.Error()}
	}
	msg, hint := ce.Message, ce.Hint
	// cobra appends its suggestions to the message of an unknown command.
	if i := strings.Index(msg, "\n\nDid you mean this?"); i >= 0 {
		hint = "did you mean " + strings.Join(strings.Fields(msg[i+len("\n\nDid you mean this?"):]), " or ") + "?"
		msg = msg[:i]
	}
	msg = strings.Join(strings.Fields(msg), " ") // exactly one line
	if structured {
		out := *ce
		out.Message, out.Hint, out.Exit = msg, hint, code
		b, _ := json.Marshal(map[string]any{"error": out})
		fmt.Fprintf(stderr, "%s\n", b)
		return
	}
	fmt.Fprintf(stderr, "waldenctl: %s\n", msg)
	if hint != "" {
		fmt.Fprintln(stderr, hint)
	}
}

// flagError adds the closest known flag to an unknown flag's error.
func flagError(cmd *cobra.Command, err error) error {
	msg := err.Error()
	name, ok := strings.CutPrefix(msg, "unknown flag: --")
	if !ok {
		return usageErr(err)
	}
	var names []string
	cmd.Flags().VisitAll(func(f *pflag.Flag) { names = append(names, f.Name) })
	cmd.InheritedFlags().VisitAll(func(f *pflag.Flag) { names = append(names, f.Name) })
	if s := closest(name, names); s != "" {
		return &callError{Message: msg, Hint: "did you mean --" + s + "?", Exit: exitUsage}
	}
	return usageErr(err)
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}
