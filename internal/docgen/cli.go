package docgen

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// CLI is the Markdown reference of root's command tree: the page's title,
// intro (Markdown the caller writes from its own tables), the global flags,
// an index of the commands, then each command (its usage, description,
// flags and examples), depth first in the order cobra lists them. Hidden
// commands and cobra's help command are left out.
func CLI(root *cobra.Command, intro string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# `%s`\n\n", root.Name())
	b.WriteString("<!-- Generated from the commands by `make docs` (internal/docgen): edit the commands' Short, Long, Example and flag usage, not this page. -->\n\n")
	b.WriteString(root.Short + ".\n\n")
	if root.Long != "" {
		b.WriteString(fence(root.Long))
	}
	if intro != "" {
		b.WriteString(strings.TrimRight(intro, "\n") + "\n\n")
	}
	b.WriteString("## Global flags\n\n")
	b.WriteString(flagTable(root.PersistentFlags()))
	b.WriteString("## Commands\n\n")
	var all []*cobra.Command
	var collect func(c *cobra.Command)
	collect = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			if sub.Hidden || sub.Name() == "help" {
				continue
			}
			all = append(all, sub)
			collect(sub)
		}
	}
	collect(root)
	for _, c := range all {
		fmt.Fprintf(&b, "- [`%s`](#%s): %s\n", c.CommandPath(), anchor(c.CommandPath()), c.Short)
	}
	b.WriteString("\n")
	for _, c := range all {
		fmt.Fprintf(&b, "## %s\n\n", c.CommandPath())
		b.WriteString(c.Short + ".\n\n")
		if c.Runnable() {
			b.WriteString(fence(c.UseLine()))
		}
		if c.Long != "" {
			b.WriteString(fence(c.Long))
		}
		if c.HasAvailableLocalFlags() {
			b.WriteString(flagTable(c.LocalNonPersistentFlags()))
		}
		if c.Example != "" {
			b.WriteString("Example:\n\n")
			b.WriteString(fence(c.Example))
		}
	}
	return strings.TrimRight(b.String(), "\n") + "\n"
}

func fence(s string) string {
	return "```\n" + strings.Trim(s, "\n") + "\n```\n\n"
}

// anchor is the heading anchor a renderer makes of a command's path.
func anchor(path string) string {
	return strings.ReplaceAll(strings.ToLower(path), " ", "-")
}

func flagTable(fs *pflag.FlagSet) string {
	var b strings.Builder
	b.WriteString("| flag | default | meaning |\n|---|---|---|\n")
	n := 0
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden || f.Name == "help" {
			return
		}
		name := "`--" + f.Name + "`"
		if f.Shorthand != "" {
			name = "`-" + f.Shorthand + "`, " + name
		}
		def := f.DefValue
		switch {
		case def == "" || def == "[]":
			def = "–"
		default:
			def = "`" + def + "`"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", name, def, strings.ReplaceAll(f.Usage, "|", "\\|"))
		n++
	})
	if n == 0 {
		return ""
	}
	return b.String() + "\n"
}
