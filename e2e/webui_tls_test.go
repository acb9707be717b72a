package e2e_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"walden/certs"
)

// nssTools returns the paths of pk12util and certutil (Debian's
// libnss3-tools, installed by scripts/install-deps.sh). Without them the
// test is skipped, except in CI, where they must be there.
func nssTools(t *testing.T) (pk12util, certutil string) {
	t.Helper()
	p, err1 := exec.LookPath("pk12util")
	c, err2 := exec.LookPath("certutil")
	if err1 != nil || err2 != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("pk12util and certutil are not installed: make deps installs them (libnss3-tools, scripts/install-deps.sh)")
		}
		t.Skip("pk12util and certutil are not installed: make deps installs them (libnss3-tools, scripts/install-deps.sh)")
	}
	return p, c
}

// TestE2EShortWebViewOverMutualTLS opens the web view as a person does,
// in a real headless Chromium over mutual TLS: a reader's certificate is
// issued as a PKCS#12 bundle (walden certs issue --p12, the passphrase
// from a file), imported into a fresh NSS store with pk12util beside the
// cluster's CA (certutil), and Chromium, reading that store, loads /ui/ of
// a coordinator that requires a client certificate; the page then shows
// the cluster. The browser's profile selects the one certificate for the
// coordinator's origin by itself (the setting the AutoSelectCertificateForUrls
// policy manages), as a person would pick it in the certificate prompt.
func TestE2EShortWebViewOverMutualTLS(t *testing.T) {
	bin := chromium(t)
	pk12util, certutil := nssTools(t)
	c := startCluster(t, nil)
	if c.PKI == "" {
		t.Fatal("the cluster runs without TLS")
	}
	dir := t.TempDir()
	pw := filepath.Join(dir, "passphrase")
	if err := os.WriteFile(pw, []byte("a long enough passphrase\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(dir, "alice.p12")
	out, err := exec.Command(waldenBin, "certs", "issue", "--dir", c.PKI, "--out", dir, "--name", "alice", "--role", "reader",
		"--p12", bundle, "--p12-password-file", pw).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "wrote "+bundle) {
		t.Fatalf("certs issue --p12: %v\n%s", err, out)
	}
	if st, err := os.Stat(bundle); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the bundle %s: %v (mode %v): it holds a private key, its owner only may read it", bundle, err, st.Mode())
	}

	// A fresh NSS store where Chromium on Linux looks: $HOME/.pki/nssdb.
	home := filepath.Join(dir, "home")
	db := "sql:" + filepath.Join(home, ".pki", "nssdb")
	if err := os.MkdirAll(filepath.Join(home, ".pki", "nssdb"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{certutil, "-N", "-d", db, "--empty-password"},
		{pk12util, "-i", bundle, "-d", db, "-w", pw},
		{certutil, "-A", "-n", "walden CA", "-t", "C,,", "-i", filepath.Join(c.PKI, certs.CAFile), "-d", db},
		{certutil, "-L", "-d", db},
	} {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Env = append(os.Environ(), "HOME="+home)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("%s:\n%s", filepath.Base(args[0]), out)
	}

	origin := "https://" + c.Coords[0].HTTP
	profile := filepath.Join(dir, "chromium")
	prefs, _ := json.Marshal(map[string]any{"profile": map[string]any{"content_settings": map[string]any{"exceptions": map[string]any{
		"auto_select_certificate": map[string]any{origin + ",*": map[string]any{"setting": map[string]any{"filters": []any{map[string]any{}}}}},
	}}}})
	if err := os.MkdirAll(filepath.Join(profile, "Default"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(profile, "Default", "Preferences"), prefs, 0o600); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(profile), chromedp.WindowSize(1280, 900), chromedp.Env("HOME="+home))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	defer cancelBrowser()

	url := origin + "/ui/"
	if err := chromedp.Do(bctx, chromedp.Navigate(url)); err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	wctx, wcancel := context.WithTimeout(bctx, 60*time.Second)
	defer wcancel()
	for _, sel := range []string{`#brokers tr[data-broker="b1"]`, `#leader[data-leader^="c"]`} {
		if err := chromedp.Do(wctx, chromedp.WaitReady(chromedp.CSS(sel))); err != nil {
			body, _ := chromedp.Run(bctx, chromedp.OuterHTML(chromedp.CSS("body")))
			t.Fatalf("the web view over mutual TLS never showed %s: %v\n%s", sel, err, body)
		}
	}
	// The page came over https, and its API answered alice (a reader):
	// no problem shown.
	got, err := chromedp.Run(bctx, chromedp.Evaluate[string](`location.protocol + " " + document.querySelector("#problems").textContent`))
	if err != nil || got != "https: " {
		t.Fatalf("protocol and problems: %q (%v)", got, err)
	}
}
