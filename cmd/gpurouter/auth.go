package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gpurouter/gpurouter/proxy"
	"github.com/gpurouter/gpurouter/proxy/auth"
)

// authConfig is client authentication by API key. It is on when any key is
// configured: auth.keys, keys_file or --api-key. Keys are stored as SHA-256
// hashes only, so the configuration (and --print-config) holds no secret.
type authConfig struct {
	// KeysFile is a YAML list of keys in the same schema as Keys (see
	// auth.ParseKeys), read at start and on every reload; a relative path
	// is relative to the configuration file. "" = none; default "".
	KeysFile string `yaml:"keys_file"`
	// Keys are inline keys; --api-key adds "flag-N" entries here.
	Keys []auth.KeyConfig `yaml:"keys"`
}

// enabled reports whether the configuration asks for client auth.
func (a authConfig) enabled() bool { return a.KeysFile != "" || len(a.Keys) > 0 }

// flagKeys turns --api-key values into keys "flag-1", "flag-2", ... for
// every model and without limits. Only their hashes are kept.
func flagKeys(secrets []string) []auth.KeyConfig {
	keys := make([]auth.KeyConfig, 0, len(secrets))
	for i, s := range secrets {
		keys = append(keys, auth.KeyConfig{ID: "flag-" + strconv.Itoa(i+1), Hash: auth.HashKey(s)})
	}
	return keys
}

// validateAuth checks the inline keys (format, uniqueness) and their tiers
// against the admission classes; keys_file is checked by clientKeys.
func (v *validator) auth(a authConfig, classes int) {
	if err := auth.ValidateKeys("auth.keys", a.Keys); err != nil {
		v.errs = append(v.errs, err)
	}
	for i, k := range a.Keys {
		if k.Tier >= classes && classes > 0 {
			v.add(fmt.Sprintf("auth.keys[%d].tier", i), "must be < admission.classes (%d), got %d", classes, k.Tier)
		}
	}
}

// resolveKeysFile makes a relative keys_file relative to the directory of
// the configuration file that names it.
func resolveKeysFile(cfg *fileConfig, configPath string) {
	if f := cfg.Auth.KeysFile; f != "" && !filepath.IsAbs(f) {
		cfg.Auth.KeysFile = filepath.Join(filepath.Dir(configPath), f)
	}
}

// clientKeys is every key the router accepts: auth.keys and the keys
// file's, with model aliases mapped to their pool's served model name (the
// name a KeyStore checks). enabled is false when auth is off. Problems of
// the file are reported with its path and line; keys in both places must
// have distinct ids and hashes.
func clientKeys(cfg fileConfig) (keys []auth.KeyConfig, enabled bool, err error) {
	a := cfg.Auth
	if !a.enabled() {
		return nil, false, nil
	}
	keys = slices.Clone(a.Keys)
	if a.KeysFile != "" {
		data, err := os.ReadFile(a.KeysFile)
		if err != nil {
			return nil, true, fmt.Errorf("auth.keys_file: %w", err)
		}
		fileKeys, err := auth.ParseKeys(data)
		if err != nil {
			return nil, true, fmt.Errorf("auth.keys_file %s:\n%w", a.KeysFile, err)
		}
		var errs []error
		for i, k := range fileKeys {
			if k.Tier >= cfg.Admission.Classes && cfg.Admission.Classes > 0 {
				errs = append(errs, fmt.Errorf("auth.keys_file %s: keys[%d].tier: must be < admission.classes (%d), got %d", a.KeysFile, i, cfg.Admission.Classes, k.Tier))
			}
			for j, in := range a.Keys {
				switch {
				case k.ID == in.ID:
					errs = append(errs, fmt.Errorf("auth.keys_file %s: keys[%d].id: %q is also auth.keys[%d]", a.KeysFile, i, k.ID, j))
				case strings.EqualFold(k.Hash, in.Hash):
					errs = append(errs, fmt.Errorf("auth.keys_file %s: keys[%d].hash: the same key as auth.keys[%d]", a.KeysFile, i, j))
				}
			}
		}
		if len(errs) > 0 {
			return nil, true, errors.Join(errs...)
		}
		keys = append(keys, fileKeys...)
	}
	canonical := map[string]string{}
	for _, p := range cfg.Pools {
		for _, alias := range p.Aliases {
			canonical[alias] = p.Model
		}
	}
	for i := range keys {
		if keys[i].Models == nil {
			continue
		}
		var models []string
		for _, m := range keys[i].Models {
			if c, ok := canonical[m]; ok {
				m = c
			}
			if !slices.Contains(models, m) {
				models = append(models, m)
			}
		}
		keys[i].Models = models
	}
	// What is left to find: a problem the checks above could not see.
	if err := auth.ValidateKeys("auth", keys); err != nil {
		return nil, true, err
	}
	return keys, true, nil
}

// newKeyStore is the KeyStore of cfg, or nil when auth is off.
func newKeyStore(cfg fileConfig) (*auth.KeyStore, error) {
	keys, enabled, err := clientKeys(cfg)
	if err != nil || !enabled {
		return nil, err
	}
	return auth.NewKeyStore(keys, nil)
}

// prepareKeys reads and checks cfg's keys for a reload; apply puts them in
// force on srv, and cannot fail: a store that exists keeps the rate-limit
// state of unchanged keys, and auth turns on or off with the configuration.
func prepareKeys(srv *proxy.Server, cfg fileConfig) (apply func(), err error) {
	keys, enabled, err := clientKeys(cfg)
	switch {
	case err != nil:
		return nil, err
	case !enabled:
		return func() { srv.SetKeys(nil) }, nil
	}
	if ks := srv.Keys(); ks != nil {
		return func() { ks.Replace(keys) }, nil //nolint:errcheck // clientKeys validated keys
	}
	ks, err := auth.NewKeyStore(keys, nil)
	if err != nil {
		return nil, err
	}
	return func() { srv.SetKeys(ks) }, nil
}

// minFlagKeyLen is the shortest --api-key accepted: its unsalted SHA-256
// is printed by --print-config, so a short key could be guessed from it.
const minFlagKeyLen = 16

// checkFlagKeys refuses --api-key values too short to be safe as hashes,
// without repeating them.
func checkFlagKeys(secrets []string) error {
	var errs []error
	for i, s := range secrets {
		if len(strings.TrimSpace(s)) < minFlagKeyLen {
			errs = append(errs, fmt.Errorf("--api-key #%d: must be at least %d characters (e.g. openssl rand -hex 32)", i+1, minFlagKeyLen))
		}
	}
	return errors.Join(errs...)
}

// printKeyHash is `serve --hash-key KEY`: it prints the KeyConfig.Hash of
// KEY, or of the first line of stdin when KEY is "-" (keeping the key out
// of the process list and shell history).
func printKeyHash(key string, stdin io.Reader, stdout, stderr io.Writer) int {
	if key == "-" {
		line, err := bufio.NewReader(stdin).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			fmt.Fprintf(stderr, "serve: --hash-key -: %v\n", err)
			return 1
		}
		key = strings.TrimRight(line, "\r\n")
	}
	if key == "" {
		fmt.Fprintln(stderr, "serve: --hash-key: empty key")
		return 2
	}
	fmt.Fprintln(stdout, auth.HashKey(key))
	return 0
}
