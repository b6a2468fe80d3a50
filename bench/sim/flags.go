package sim

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
)

// EngineFlags carries vLLM engine arguments given on a command line
// (--max-num-seqs, --enable-prefix-caching, --kv-cache-dtype fp8, …; see
// KnobNames) until they are applied to profiles.
type EngineFlags struct {
	set [][2]string // name, value, in command-line order
}

// RegisterEngineFlags defines one flag per engine argument on fs, under
// vLLM's names, plus the --no-enable-* forms of the booleans.
func RegisterEngineFlags(fs *flag.FlagSet) *EngineFlags {
	ef := &EngineFlags{}
	for _, name := range KnobNames() {
		switch name {
		case "enable-chunked-prefill", "enable-prefix-caching", "enable-lora":
			fs.Var(&knobFlag{ef: ef, name: name, isBool: true}, name, "vLLM engine argument (true|false)")
			fs.Var(&knobFlag{ef: ef, name: "no-" + name, isBool: true}, "no-"+name, "vLLM engine argument: disable "+strings.TrimPrefix(name, "enable-"))
		default:
			fs.Var(&knobFlag{ef: ef, name: name}, name, "vLLM engine argument")
		}
	}
	return ef
}

// Apply sets the given arguments on p and validates it.
func (ef *EngineFlags) Apply(p *Profile) error {
	for _, kv := range ef.set {
		if err := p.Set(kv[0], kv[1]); err != nil {
			return err
		}
	}
	return p.Validate()
}

// Given reports whether any engine argument was set.
func (ef *EngineFlags) Given() bool { return len(ef.set) > 0 }

type knobFlag struct {
	ef     *EngineFlags
	name   string
	isBool bool
	value  string
}

func (k *knobFlag) String() string   { return k.value }
func (k *knobFlag) IsBoolFlag() bool { return k.isBool }
func (k *knobFlag) Set(v string) error {
	if k.isBool && strings.HasPrefix(k.name, "no-") {
		b, err := parseBool(v)
		if err != nil {
			return err
		}
		v = strconv.FormatBool(!b)
		k.ef.set = append(k.ef.set, [2]string{strings.TrimPrefix(k.name, "no-"), v})
		return nil
	}
	if err := (&Profile{Engine: DefaultEngine()}).Set(k.name, v); err != nil {
		return err
	}
	k.value = v
	k.ef.set = append(k.ef.set, [2]string{k.name, v})
	return nil
}

// ResolveProfile returns the built-in profile of that name, or loads a YAML
// file when the argument looks like a path (contains a slash or ends in
// .yaml/.yml).
func ResolveProfile(nameOrPath string) (Profile, error) {
	if strings.Contains(nameOrPath, "/") || strings.HasSuffix(nameOrPath, ".yaml") || strings.HasSuffix(nameOrPath, ".yml") {
		return LoadProfile(nameOrPath)
	}
	return Builtin(nameOrPath)
}

// ParseFloatList parses "1,1,0.5" (empty = nil).
func ParseFloatList(s string) ([]float64, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []float64
	for _, part := range strings.Split(s, ",") {
		f, err := strconv.ParseFloat(strings.TrimSpace(part), 64)
		if err != nil {
			return nil, fmt.Errorf("sim: %q is not a number", part)
		}
		out = append(out, f)
	}
	return out, nil
}
