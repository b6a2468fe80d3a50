package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// LoRAModule is one adapter a replica serves from the start, as an entry
// of vLLM's --lora-modules. The simulator reads no file: Path is only
// reported (as the adapter's root in /v1/models).
type LoRAModule struct {
	Name string `json:"name"`
	Path string `json:"path"`
	// BaseModelName is the adapter's parent in /v1/models; "" = the
	// replica's first served model name.
	BaseModelName string `json:"base_model_name,omitempty"`
}

// Errors of the LoRA adapter API (LoadLoRAAdapter, UnloadLoRAAdapter and
// their HTTP routes). Each comes wrapped with vLLM's message for it.
var (
	ErrLoRADisabled = errors.New("sim: LoRA is not enabled")
	ErrLoRAInvalid  = errors.New("sim: invalid LoRA adapter request")
	ErrLoRAExists   = errors.New("sim: LoRA adapter already loaded")
	ErrLoRANotFound = errors.New("sim: LoRA adapter not found")
	ErrLoRARefused  = errors.New("sim: LoRA adapter load refused (lora_load_refuse fault)")
)

// loraError is a LoRA API error: one of the sentinels, and the message
// vLLM answers with.
type loraError struct {
	kind error
	msg  string
}

func (e *loraError) Error() string { return e.kind.Error() + ": " + e.msg }
func (e *loraError) Unwrap() error { return e.kind }

func loraErr(kind error, format string, a ...any) error {
	return &loraError{kind: kind, msg: fmt.Sprintf(format, a...)}
}

func errLoRADisabled() error {
	return loraErr(ErrLoRADisabled, "LoRA is not enabled. Use --enable-lora to enable LoRA.")
}

// ParseLoRAModules reads --lora-modules values as vLLM does: each is
// name=path or a JSON object {"name": …, "path": …, "base_model_name": …}.
func ParseLoRAModules(values []string) ([]LoRAModule, error) {
	var out []LoRAModule
	for _, v := range values {
		v = strings.TrimSpace(v)
		var m LoRAModule
		if strings.HasPrefix(v, "{") {
			dec := json.NewDecoder(strings.NewReader(v))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&m); err != nil {
				return nil, fmt.Errorf("sim: invalid JSON format for --lora-modules %q: %w", v, err)
			}
		} else {
			name, path, ok := strings.Cut(v, "=")
			if !ok {
				return nil, fmt.Errorf("sim: --lora-modules %q: want name=path or a JSON object", v)
			}
			m = LoRAModule{Name: name, Path: path}
		}
		if m.Name == "" || m.Path == "" {
			return nil, fmt.Errorf("sim: --lora-modules %q: both name and path are required", v)
		}
		out = append(out, m)
	}
	return out, nil
}

// adapterSet is the adapters a replica serves, in load order. Immutable:
// loads and unloads publish a new one.
type adapterSet []*loraAdapter

func (as adapterSet) find(name string) *loraAdapter {
	for _, a := range as {
		if a.name == name {
			return a
		}
	}
	return nil
}

// setupLoRA registers the --lora-modules adapters and preloads them as
// vLLM does at start: each goes into the CPU cache and a GPU slot in turn,
// so the last max_cpu_loras stay cached and the last max_loras in slots.
func (r *Replica) setupLoRA(mods []LoRAModule) error {
	empty := adapterSet{}
	r.adapters.Store(&empty)
	if len(mods) == 0 {
		return nil
	}
	if r.eng.lora == nil {
		return fmt.Errorf("sim: --lora-modules: %w", errLoRADisabled())
	}
	for _, m := range mods {
		a, err := r.addAdapter(m.Name, m.Path, m.BaseModelName)
		if err != nil {
			return err
		}
		r.eng.lora.preload(a)
	}
	return nil
}

// addAdapter makes a new adapter and publishes it. r.loraMu must be held
// (or r not yet shared).
func (r *Replica) addAdapter(name, path, parent string) (*loraAdapter, error) {
	cur := *r.adapters.Load()
	if name == "" || path == "" {
		return nil, loraErr(ErrLoRAInvalid, "Both 'lora_name' and 'lora_path' must be provided.")
	}
	if cur.find(name) != nil {
		return nil, loraErr(ErrLoRAExists, "The lora adapter '%s' has already been loaded.", name)
	}
	if slices.Contains(r.names, name) {
		return nil, loraErr(ErrLoRAExists, "'%s' is a served model name, not an adapter.", name)
	}
	r.nextLoRAID++
	a := &loraAdapter{id: r.nextLoRAID, name: name, path: path, parent: parent}
	next := append(slices.Clip(cur), a)
	r.adapters.Store(&next)
	return a, nil
}

// resolveModel finds what a request's model names: the base model (one of
// the served names, or "", nil adapter) or an adapter.
func (r *Replica) resolveModel(name string) (*loraAdapter, bool) {
	if r.knownModel(name) {
		return nil, true
	}
	if a := r.adapters.Load().find(name); a != nil {
		return a, true
	}
	return nil, false
}

// Adapters lists the names of the adapters the replica serves, in load
// order.
func (r *Replica) Adapters() []string { return names(*r.adapters.Load()) }

// LoadLoRAAdapter loads an adapter at run time, as vLLM's
// POST /v1/load_lora_adapter: from disk into the CPU cache and a GPU slot,
// which holds the engine up for as long as it takes (returned). The
// lora_load_refuse fault fails it with ErrLoRARefused; the
// lora_load_delay_seconds fault is the HTTP route's.
func (r *Replica) LoadLoRAAdapter(name, path string) (time.Duration, error) {
	r.loraMu.Lock()
	defer r.loraMu.Unlock()
	if r.eng.lora == nil {
		return 0, errLoRADisabled()
	}
	if name == "" || path == "" {
		return 0, loraErr(ErrLoRAInvalid, "Both 'lora_name' and 'lora_path' must be provided.")
	}
	if r.faults.Load().LoRALoadRefuse {
		return 0, loraErr(ErrLoRARefused, "Loading lora %s failed", path)
	}
	a, err := r.addAdapter(name, path, "")
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	d := r.eng.lora.load(a)
	r.mu.Unlock()
	r.kick()
	return d, nil
}

// UnloadLoRAAdapter stops serving an adapter, as vLLM's
// POST /v1/unload_lora_adapter: new requests for it get 404; those in
// flight finish. Its cache entries age out (a later load is a new adapter).
func (r *Replica) UnloadLoRAAdapter(name string) error {
	r.loraMu.Lock()
	defer r.loraMu.Unlock()
	if name == "" {
		return loraErr(ErrLoRAInvalid, "either 'lora_name' and 'lora_int_id' needs to be provided.")
	}
	cur := *r.adapters.Load()
	i := slices.IndexFunc(cur, func(a *loraAdapter) bool { return a.name == name })
	if i < 0 {
		return loraErr(ErrLoRANotFound, "The lora adapter '%s' cannot be found.", name)
	}
	next := slices.Delete(slices.Clone(cur), i, i+1)
	r.adapters.Store(&next)
	return nil
}

// serveLoadLoRA answers POST /v1/load_lora_adapter.
func (inc *incarnation) serveLoadLoRA(ctx *fasthttp.RequestCtx) {
	var req struct {
		LoRAName string `json:"lora_name"`
		LoRAPath string `json:"lora_path"`
	}
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
		writeBadRequest(ctx, "invalid JSON body: "+err.Error())
		return
	}
	d, err := inc.r.LoadLoRAAdapter(req.LoRAName, req.LoRAPath)
	// The engine answers once the load is done; the fault makes the load
	// itself slow (a remote store, a cold disk).
	if !inc.waitFor(d + secondsDur(inc.r.faults.Load().LoRALoadDelaySeconds)) {
		dropConn(ctx)
		return
	}
	if err != nil {
		writeLoRAError(ctx, err)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetBodyString(fmt.Sprintf("Success: LoRA adapter '%s' added successfully.", req.LoRAName))
}

// serveUnloadLoRA answers POST /v1/unload_lora_adapter.
func (inc *incarnation) serveUnloadLoRA(ctx *fasthttp.RequestCtx) {
	var req struct {
		LoRAName string `json:"lora_name"`
	}
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
		writeBadRequest(ctx, "invalid JSON body: "+err.Error())
		return
	}
	if err := inc.r.UnloadLoRAAdapter(req.LoRAName); err != nil {
		writeLoRAError(ctx, err)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetBodyString(fmt.Sprintf("Success: LoRA adapter '%s' removed successfully.", req.LoRAName))
}

// writeLoRAError answers as vLLM's serving_models does: its own checks are
// 400 InvalidUserInput or 404 NotFoundError, an engine failure 400
// BadRequestError.
func writeLoRAError(ctx *fasthttp.RequestCtx, err error) {
	msg := err.Error()
	var le *loraError
	if errors.As(err, &le) {
		msg = le.msg
	}
	switch {
	case errors.Is(err, ErrLoRANotFound):
		writeError(ctx, fasthttp.StatusNotFound, "NotFoundError", msg)
	case errors.Is(err, ErrLoRAInvalid), errors.Is(err, ErrLoRAExists):
		writeError(ctx, fasthttp.StatusBadRequest, "InvalidUserInput", msg)
	default:
		writeError(ctx, fasthttp.StatusBadRequest, "BadRequestError", msg)
	}
}

// waitFor waits d unless the incarnation ends first (false).
func (inc *incarnation) waitFor(d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-inc.quit:
		return false
	}
}

// loraModelCards are the adapters' entries in /v1/models: root is the
// adapter's path, parent its base model, max_model_len null, as vLLM's.
func (r *Replica) loraModelCards() []modelCard {
	var out []modelCard
	for _, a := range *r.adapters.Load() {
		parent := a.parent
		if parent == "" {
			parent = r.names[0]
		}
		out = append(out, r.modelCard(a.name, a.path, &parent, nil))
	}
	return out
}
