package main

import (
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"walden/authz"
	"walden/certs"
)

func init() { rootCmd.AddCommand(newCertsCmd()) }

func newCertsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "certs",
		Short: "Create the cluster's CA and the certificates of its members, brokers and people",
		Long: `certs makes the mutual-TLS certificates of a walden deployment, in the manner
of Consul's "consul tls":

  walden certs init  --dir DIR                 a CA (ca.pem, ca-key.pem) and a gossip key (gossip.key)
  walden certs issue --dir DIR --name NAME --role ROLE [--broker-id ID] [--host H]...
                   [--p12 FILE [--p12-password-file F]]
                                               NAME.pem and NAME-key.pem, signed by the CA of DIR;
                                               --p12 also a PKCS#12 bundle a browser imports
  walden certs show FILE                       the identity, validity and hosts of a certificate

Every certificate carries one identity: its name (the subject's common name),
one role (the organization "walden:<role>") and, for the agent and broker
roles, the one broker id it acts for (the organizational unit
"walden:broker-id:<id>"). Roles:

  coordinator  a coordinator member (--name is its node_id): raft and forwarding
  admin        everything an operator does, and membership (member add/remove)
  operator     reads, failover, ack, maintenance, jobs cancel/retry, policy, leader transfer
  reader       reads the cluster's state
  agent        registers and renews the lease of its own broker (--broker-id)
  broker       an agent that also writes its own streams in the catalog (--broker-id)

Coordinator and broker certificates are valid as servers for localhost,
127.0.0.1, ::1 and every --host. Files are never overwritten; private keys
are written readable by their owner only. Keep ca-key.pem off the hosts that
run walden: only "certs issue" needs it.`,
	}
	cmd.AddCommand(newCertsInitCmd(), newCertsIssueCmd(), newCertsShowCmd())
	return cmd
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newCertsInitCmd() *cobra.Command {
	var dir, name, output string
	var days int
	cmd := &cobra.Command{
		Use:   "init --dir DIR",
		Short: "Create a CA (ca.pem, ca-key.pem) and a gossip encryption key (gossip.key) in DIR",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return fmt.Errorf("certs init: %w", err)
			}
			if dir == "" {
				return errors.New("certs init: --dir DIR is required")
			}
			if days <= 0 {
				return fmt.Errorf("certs init: --days: must be positive, got %d", days)
			}
			ca, err := certs.Init(dir, name, time.Duration(days)*24*time.Hour)
			if err != nil {
				return fmt.Errorf("certs init: %w", certsErr(err))
			}
			out := struct {
				CAFile        string    `json:"ca_file"`
				CAKeyFile     string    `json:"ca_key_file"`
				GossipKeyFile string    `json:"gossip_key_file"`
				Subject       string    `json:"subject"`
				NotAfter      time.Time `json:"not_after"`
			}{filepath.Join(dir, certs.CAFile), filepath.Join(dir, certs.CAKeyFile), filepath.Join(dir, certs.GossipKeyFile),
				ca.Cert.Subject.String(), ca.Cert.NotAfter.UTC()}
			w := cmd.OutOrStdout()
			if output == "json" {
				return writeJSON(w, out)
			}
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "wrote %s\tthe CA certificate (every process's tls.ca_file), valid until %s\n", out.CAFile, out.NotAfter.Format(time.DateOnly))
			fmt.Fprintf(tw, "wrote %s\tthe CA's private key: keep it off the hosts that run walden\n", out.CAKeyFile)
			fmt.Fprintf(tw, "wrote %s\tthe gossip encryption key: members and agents read it from beside tls.ca_file\n", out.GossipKeyFile)
			tw.Flush()
			fmt.Fprintf(w, "next: walden certs issue --dir %s --name c1 --role coordinator --host <c1's address>\n", dir)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "directory of the CA (created when missing; refused when it already holds one)")
	f.StringVar(&name, "name", "walden CA", "common name of the CA")
	f.IntVar(&days, "days", int(certs.DefaultCAValidity/(24*time.Hour)), "days the CA is valid")
	f.StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

func newCertsIssueCmd() *cobra.Command {
	var dir, out, name, role, brokerID, output, p12, p12PasswordFile string
	var hosts []string
	var days int
	cmd := &cobra.Command{
		Use:   "issue --dir DIR --name NAME --role ROLE [--broker-id ID] [--host H]...",
		Short: "Issue NAME.pem and NAME-key.pem, carrying NAME, ROLE and the broker id, signed by the CA of DIR",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return fmt.Errorf("certs issue: %w", err)
			}
			switch {
			case dir == "":
				return errors.New("certs issue: --dir DIR is required (the directory of walden certs init)")
			case name == "":
				return errors.New("certs issue: --name NAME is required (a coordinator's node_id, a broker id, a person's or tool's name)")
			case role == "":
				return errors.New("certs issue: --role ROLE is required (coordinator, admin, operator, reader, agent or broker)")
			case days <= 0:
				return fmt.Errorf("certs issue: --days: must be positive, got %d", days)
			}
			r, err := authz.ParseRole(role)
			if err != nil {
				return fmt.Errorf("certs issue: --role: %w", err)
			}
			if r.BrokerBound() && brokerID == "" {
				return fmt.Errorf("certs issue: --broker-id is required with --role %s (the one broker it acts for)", r)
			}
			if !r.BrokerBound() && brokerID != "" {
				return fmt.Errorf("certs issue: --broker-id is only for the agent and broker roles, not %s", r)
			}
			req := certs.Request{Identity: authz.Identity{Name: name, Role: r, BrokerID: brokerID}, Hosts: hosts,
				Validity: time.Duration(days) * 24 * time.Hour}
			var password string
			if p12 != "" {
				// Everything the bundle needs is checked before anything
				// is written.
				if _, err := os.Lstat(p12); err == nil {
					return fmt.Errorf("certs issue: --p12: %s already exists", p12)
				}
				if password, err = p12Password(cmd, p12PasswordFile); err != nil {
					return fmt.Errorf("certs issue: %w", err)
				}
			} else if p12PasswordFile != "" {
				return errors.New("certs issue: --p12-password-file goes with --p12 FILE")
			}
			files, err := certs.IssueFiles(dir, out, req)
			if err != nil {
				return fmt.Errorf("certs issue: %w", certsErr(err))
			}
			if p12 != "" {
				if err := certs.WriteP12(dir, files, p12, password); err != nil {
					os.Remove(files.Cert)
					os.Remove(files.Key)
					return fmt.Errorf("certs issue: --p12: %w", certsErr(err))
				}
				files.P12 = p12
			}
			info, err := describeCert(files.Cert)
			if err != nil {
				return fmt.Errorf("certs issue: %w", err)
			}
			w := cmd.OutOrStdout()
			if output == "json" {
				return writeJSON(w, struct {
					certs.Files
					certInfo
				}{files, info})
			}
			fmt.Fprintf(w, "wrote %s and %s\n", files.Cert, files.Key)
			if files.P12 != "" {
				fmt.Fprintf(w, "wrote %s: the certificate, its key and the CA, for a browser (import it with the passphrase)\n", files.P12)
			}
			printCertInfo(w, info)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "directory of the CA (walden certs init)")
	f.StringVar(&out, "out", "", "directory to write the certificate and key to (default: --dir)")
	f.StringVar(&name, "name", "", "identity: a coordinator's node_id, a broker's id, a person's or tool's name")
	f.StringVar(&role, "role", "", "coordinator, admin, operator, reader, agent or broker")
	f.StringVar(&brokerID, "broker-id", "", "the broker an agent or broker certificate acts for")
	f.StringSliceVar(&hosts, "host", nil, "DNS name or IP address the certificate serves (repeatable)")
	f.IntVar(&days, "days", int(certs.DefaultCertValidity/(24*time.Hour)), "days the certificate is valid (at most as long as the CA)")
	f.StringVarP(&output, "output", "o", "table", "output format: table or json")
	f.StringVar(&p12, "p12", "", "also write FILE: a PKCS#12 bundle of the certificate, its key and the CA, encrypted with a passphrase, that Chromium and Firefox import (for the web view)")
	f.StringVar(&p12PasswordFile, "p12-password-file", "", "read the --p12 passphrase from the first line of this file (default: ask on the terminal, twice)")
	return cmd
}

// p12Password is the passphrase of a PKCS#12 bundle: the first line of
// file, or typed twice on the terminal without echo.
func p12Password(cmd *cobra.Command, file string) (string, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("--p12-password-file: %w", err)
		}
		pw, _, _ := strings.Cut(string(b), "\n")
		pw = strings.TrimSuffix(pw, "\r")
		if len(pw) < certs.MinP12PasswordLen {
			return "", fmt.Errorf("--p12-password-file: the passphrase in %s must have at least %d characters", file, certs.MinP12PasswordLen)
		}
		return pw, nil
	}
	fd := int(os.Stdin.Fd())
	if !term.IsTerminal(fd) {
		return "", errors.New("--p12: no terminal to ask the passphrase on: give --p12-password-file FILE")
	}
	ask := func(prompt string) (string, error) {
		fmt.Fprint(cmd.ErrOrStderr(), prompt)
		b, err := term.ReadPassword(fd)
		fmt.Fprintln(cmd.ErrOrStderr())
		return string(b), err
	}
	pw, err := ask("passphrase for the PKCS#12 bundle: ")
	if err != nil {
		return "", fmt.Errorf("--p12: read the passphrase: %w", err)
	}
	if len(pw) < certs.MinP12PasswordLen {
		return "", fmt.Errorf("--p12: the passphrase must have at least %d characters", certs.MinP12PasswordLen)
	}
	again, err := ask("the same passphrase again: ")
	if err != nil {
		return "", fmt.Errorf("--p12: read the passphrase: %w", err)
	}
	if again != pw {
		return "", errors.New("--p12: the two passphrases differ; nothing was written")
	}
	return pw, nil
}

func newCertsShowCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "show FILE",
		Short: "Print the identity, validity and hosts of a certificate",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return fmt.Errorf("certs show: %w", err)
			}
			info, err := describeCert(args[0])
			if err != nil {
				return fmt.Errorf("certs show: %w", err)
			}
			if output == "json" {
				return writeJSON(cmd.OutOrStdout(), info)
			}
			printCertInfo(cmd.OutOrStdout(), info)
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

// certInfo is what `certs show` prints.
type certInfo struct {
	Name      string    `json:"name"`
	Role      string    `json:"role"`
	BrokerID  string    `json:"broker_id,omitempty"`
	Identity  string    `json:"identity_error,omitempty"`
	Issuer    string    `json:"issuer"`
	NotBefore time.Time `json:"not_before"`
	NotAfter  time.Time `json:"not_after"`
	Hosts     []string  `json:"hosts"`
	IsCA      bool      `json:"is_ca"`
}

func describeCert(path string) (certInfo, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return certInfo{}, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return certInfo{}, fmt.Errorf("%s holds no PEM certificate", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return certInfo{}, fmt.Errorf("%s: %w", path, err)
	}
	info := certInfo{Name: c.Subject.CommonName, Issuer: c.Issuer.CommonName, NotBefore: c.NotBefore.UTC(), NotAfter: c.NotAfter.UTC(),
		IsCA: c.IsCA, Hosts: append([]string{}, c.DNSNames...)}
	for _, ip := range c.IPAddresses {
		info.Hosts = append(info.Hosts, ip.String())
	}
	if !c.IsCA {
		id, err := authz.FromCertificate(c)
		var ie *authz.IdentityError
		switch {
		case errors.As(err, &ie):
			info.Identity = ie.Reason
		case err != nil:
			info.Identity = err.Error()
		default:
			info.Role, info.BrokerID = string(id.Role), id.BrokerID
		}
	}
	return info, nil
}

func printCertInfo(w io.Writer, info certInfo) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "  name\t%s\n", info.Name)
	switch {
	case info.IsCA:
		fmt.Fprintf(tw, "  role\t(a CA: it signs certificates and carries no identity)\n")
	case info.Identity != "":
		fmt.Fprintf(tw, "  role\tnone: %s (walden allows this certificate nothing)\n", info.Identity)
	case info.BrokerID != "":
		fmt.Fprintf(tw, "  role\t%s of broker %s\n", info.Role, info.BrokerID)
	default:
		fmt.Fprintf(tw, "  role\t%s\n", info.Role)
	}
	fmt.Fprintf(tw, "  issuer\t%s\n", info.Issuer)
	fmt.Fprintf(tw, "  valid\t%s to %s\n", info.NotBefore.Format(time.RFC3339), info.NotAfter.Format(time.RFC3339))
	if !info.IsCA {
		hosts := "(none: a client certificate only)"
		if len(info.Hosts) > 0 {
			hosts = strings.Join(info.Hosts, ", ")
		}
		fmt.Fprintf(tw, "  hosts\t%s\n", hosts)
	}
	tw.Flush()
}

// certsErr turns the package's errors into sentences without its prefix.
func certsErr(err error) error {
	msg := strings.TrimPrefix(err.Error(), "certs: ")
	return errors.New(strings.TrimPrefix(msg, "invalid request: "))
}
