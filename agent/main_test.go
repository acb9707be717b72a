package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"

	"walden/config"
)

// TestMain lets the test binary be the processes the agent starts: with
// WALDEN_AGENT_TEST_ROLE=watchdog it is the watchdog process (RunWatchdog,
// as `walden agent watchdog` is), with WALDEN_AGENT_TEST_ROLE=broker a
// stand-in broker (it listens on its first argument, when given, and runs
// until killed; SIGTERM ends it), with WALDEN_AGENT_TEST_ROLE=agent an
// agent process (as `walden agent --config FILE`).
func TestMain(m *testing.M) {
	switch os.Getenv("WALDEN_AGENT_TEST_ROLE") {
	case "watchdog":
		if err := RunWatchdog(os.Stdin, os.Stdout, os.NewFile(3, "broker-stdout"), os.NewFile(4, "broker-stderr")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	case "agent":
		// An agent process on the configuration file os.Args[1]; SIGTERM
		// stops it.
		os.Exit(runTestAgent(os.Args[1]))
	case "broker":
		if len(os.Args) > 1 {
			ln, err := net.Listen("tcp", os.Args[1])
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					c.Close()
				}
			}()
		}
		term := make(chan os.Signal, 1)
		signal.Notify(term, syscall.SIGTERM)
		<-term
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runTestAgent runs an agent process on the configuration file path, with
// the test binary as its watchdog process, until SIGTERM.
func runTestAgent(path string) int {
	cfg, err := config.LoadAgent(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env, err := exec.LookPath("env")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	a, err := New(cfg, Options{Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)),
		WatchdogCommand: []string{env, "WALDEN_AGENT_TEST_ROLE=watchdog", os.Args[0]}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := a.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
