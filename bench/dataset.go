package bench

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"

	"github.com/gpurouter/gpurouter/bench/tokens"
)

// Dataset names accepted by LoadDataset (--dataset-name).
const (
	DatasetRandom            = "random"
	DatasetShareGPT          = "sharegpt"
	DatasetShareGPTSynthetic = "sharegpt-synthetic"
	DatasetAzureTrace        = "azure-trace"
	DatasetUseCase           = "usecase"
	DatasetCustom            = "custom"
	DatasetMooncake          = "mooncake"
)

// DatasetNames lists every dataset LoadDataset knows, for help texts.
func DatasetNames() []string {
	return []string{DatasetRandom, DatasetShareGPT, DatasetShareGPTSynthetic, DatasetAzureTrace, DatasetUseCase, DatasetCustom, DatasetMooncake}
}

// ErrDataset is wrapped by every error about a dataset's options or content.
var ErrDataset = errors.New("bench: dataset")

// DatasetConfig says which dataset to build and how. The zero value is not
// valid: Name and Estimator are required; every other zero means the
// documented default.
type DatasetConfig struct {
	// Name is one of DatasetNames.
	Name string
	// Path is the file for sharegpt, azure-trace, custom and mooncake.
	Path string
	// NumPrompts is how many requests to produce. 0 means 1000 (vllm bench's
	// default), except for the traces (azure-trace, mooncake), where it is
	// the first NumPrompts rows and 0 means the whole trace.
	NumPrompts int
	// Seed makes sampling deterministic: the same seed gives the same
	// requests and the same prompts.
	Seed uint64

	// RandomInputLen and RandomOutputLen are the random dataset's lengths
	// (0 means 1024 and 128, vllm's defaults); usecase uses only the ratio.
	RandomInputLen, RandomOutputLen int
	// RandomRangeRatio r draws lengths uniformly from [L·(1−r), L·(1+r)]
	// (integers, floor and ceil, output at least 1), as vllm bench does. It
	// must be in [0, 1). Applies to random and usecase.
	RandomRangeRatio float64
	// RandomOutputRangeRatio, when > 0, is the output lengths' range ratio
	// instead of RandomRangeRatio (e.g. prompts 8k-32k, outputs 100-800).
	RandomOutputRangeRatio float64

	// ShareGPTOutputLen, when > 0, replaces each sharegpt completion's token
	// count as the output length (vllm's --sharegpt-output-len).
	ShareGPTOutputLen int
	// CustomOutputLen is the output length of custom records without
	// output_tokens; 0 means 256 (vllm's --custom-output-len).
	CustomOutputLen int

	// TimeScale speeds a trace up or slows it down: arrival offsets are
	// divided by it, so 2 replays twice as fast (twice the request rate) and
	// 0.5 at half speed. 0 means 1.
	TimeScale float64

	// MaxModelLen, when > 0, drops the requests whose prompt plus output
	// is longer (Dataset.Dropped counts them), as vLLM refuses them.
	MaxModelLen int

	// Estimator counts and synthesises tokens. Required.
	Estimator *tokens.Estimator
}

func (c DatasetConfig) numPrompts() int {
	if c.NumPrompts > 0 {
		return c.NumPrompts
	}
	return 1000
}

// Validate reports every problem with c, joined.
func (c DatasetConfig) Validate() error {
	var errs []error
	known := false
	for _, n := range DatasetNames() {
		known = known || n == c.Name
	}
	if !known {
		errs = append(errs, fmt.Errorf("%w: unknown dataset %q (want one of %s)", ErrDataset, c.Name, strings.Join(DatasetNames(), ", ")))
	}
	needsPath := c.Name == DatasetShareGPT || c.Name == DatasetAzureTrace || c.Name == DatasetCustom || c.Name == DatasetMooncake
	if needsPath && c.Path == "" {
		errs = append(errs, fmt.Errorf("%w: %s needs a dataset path", ErrDataset, c.Name))
	}
	if c.NumPrompts < 0 || c.MaxModelLen < 0 {
		errs = append(errs, fmt.Errorf("%w: num prompts %d and max model len %d must not be negative", ErrDataset, c.NumPrompts, c.MaxModelLen))
	}
	if c.RandomInputLen < 0 || c.RandomOutputLen < 0 || c.ShareGPTOutputLen < 0 || c.CustomOutputLen < 0 {
		errs = append(errs, fmt.Errorf("%w: lengths must not be negative", ErrDataset))
	}
	for _, r := range []float64{c.RandomRangeRatio, c.RandomOutputRangeRatio} {
		if r < 0 || r >= 1 || math.IsNaN(r) {
			errs = append(errs, fmt.Errorf("%w: random range ratio %v not in [0, 1)", ErrDataset, r))
		}
	}
	if c.TimeScale < 0 || math.IsNaN(c.TimeScale) || math.IsInf(c.TimeScale, 0) {
		errs = append(errs, fmt.Errorf("%w: time scale %v must be a positive number", ErrDataset, c.TimeScale))
	}
	if c.Estimator == nil {
		errs = append(errs, fmt.Errorf("%w: no token estimator", ErrDataset))
	}
	return errors.Join(errs...)
}

// LoadDataset builds the dataset c describes, reading c.Path where the
// dataset needs a file, and drops what c.MaxModelLen cannot take.
func LoadDataset(c DatasetConfig) (*Dataset, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	d, err := loadDataset(c)
	if err != nil {
		return nil, err
	}
	d.dropLongerThan(c.MaxModelLen)
	return d, nil
}

func loadDataset(c DatasetConfig) (*Dataset, error) {
	rng := newRand(c.Seed)
	switch c.Name {
	case DatasetRandom:
		return RandomDataset(c, rng), nil
	case DatasetShareGPTSynthetic:
		return ShareGPTSyntheticDataset(c, rng), nil
	case DatasetUseCase:
		return UseCaseDataset(c, rng), nil
	}
	f, err := os.Open(c.Path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDataset, err)
	}
	defer f.Close()
	switch c.Name {
	case DatasetShareGPT:
		pairs, err := ParseShareGPT(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.Path, err)
		}
		return ShareGPTDataset(pairs, c, rng)
	case DatasetAzureTrace:
		rows, err := ParseTrace(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.Path, err)
		}
		return TraceDataset(rows, c, rng), nil
	case DatasetMooncake:
		rows, err := ParseMooncake(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.Path, err)
		}
		return MooncakeDataset(rows, c, rng), nil
	default: // DatasetCustom
		recs, err := ParseCustom(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.Path, err)
		}
		return CustomDataset(recs, c, rng)
	}
}

// newRand is the one place a seed becomes a generator, so equal seeds give
// equal streams everywhere in the package.
func newRand(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, seed^0x9E3779B97F4A7C15))
}

// rangeLen draws a length uniformly from [floor(l·(1−r)), ceil(l·(1+r))], at
// least minLen, the way vllm bench's random dataset does.
func rangeLen(rng *rand.Rand, l int, r float64, minLen int) int {
	lo := int(math.Floor(float64(l) * (1 - r)))
	hi := int(math.Ceil(float64(l) * (1 + r)))
	lo = max(lo, minLen)
	hi = max(hi, lo)
	if hi == lo {
		return lo
	}
	return lo + rng.IntN(hi-lo+1)
}
