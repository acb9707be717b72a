package main

import "github.com/spf13/cobra"

func init() { rootCmd.AddCommand(automqCmd) }

// automqCmd is the parent of the commands that work with AutoMQ 1.x brokers
// (`walden automq ...`). Each subcommand lives in its own file
// (automq_<name>.go) and adds itself to automqCmd in an init function.
var automqCmd = &cobra.Command{
	Use:   "automq",
	Short: "Work with AutoMQ 1.x brokers",
	Long: `Work with AutoMQ 1.x brokers: fail a dead broker over through AutoMQ's own
controller protocol and object format, inspect AutoMQ objects, and run the
development tools that stand in for AutoMQ where no AutoMQ can run.`,
	Args: cobra.NoArgs,
}
