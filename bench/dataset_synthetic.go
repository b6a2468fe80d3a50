package bench

import (
	"math"
	"math/rand/v2"
)

// RandomDataset is vllm bench's random dataset: c.NumPrompts requests whose
// input and output lengths are drawn uniformly around RandomInputLen and
// RandomOutputLen (see DatasetConfig.RandomRangeRatio). Prompts are
// synthesised at send time, each from its own seed.
func RandomDataset(c DatasetConfig, rng *rand.Rand) *Dataset {
	in, out := c.RandomInputLen, c.RandomOutputLen
	if in == 0 {
		in = 1024
	}
	if out == 0 {
		out = 128
	}
	outRatio := c.RandomRangeRatio
	if c.RandomOutputRangeRatio > 0 {
		outRatio = c.RandomOutputRangeRatio
	}
	n := c.numPrompts()
	d := &Dataset{Name: DatasetRandom, Requests: make([]Request, n)}
	for i := range d.Requests {
		d.Requests[i] = Request{
			PromptTokens: rangeLen(rng, in, c.RandomRangeRatio, 1),
			OutputTokens: rangeLen(rng, out, outRatio, 1),
			PromptSeed:   rng.Uint64(),
		}
	}
	return d
}

// ShareGPT-like length distributions for the synthetic stand-in: log-normal
// input and output lengths, then vllm's ShareGPT filter (prompt 4…1024,
// output ≥ 4, prompt+output ≤ 2048). With these parameters the means land
// near what vllm bench reports for the real file with vllm's filter (≈230
// input and ≈200 output tokens per request; vllm-reference.md §5.1), with
// the same long right tails.
const (
	shareGPTInMedian, shareGPTInSigma   = 175.0, 0.95
	shareGPTOutMedian, shareGPTOutSigma = 128.0, 1.0
)

// ShareGPTSyntheticDataset approximates ShareGPT's length distribution
// without the file: for the sharegpt profile when no --dataset-path is given.
func ShareGPTSyntheticDataset(c DatasetConfig, rng *rand.Rand) *Dataset {
	n := c.numPrompts()
	d := &Dataset{Name: DatasetShareGPTSynthetic, Requests: make([]Request, n)}
	for i := range d.Requests {
		var in, out int
		for {
			in = int(math.Round(shareGPTInMedian * math.Exp(shareGPTInSigma*rng.NormFloat64())))
			out = int(math.Round(shareGPTOutMedian * math.Exp(shareGPTOutSigma*rng.NormFloat64())))
			if validShareGPTLens(in, out) {
				break
			}
		}
		if c.ShareGPTOutputLen > 0 {
			out = c.ShareGPTOutputLen
		}
		d.Requests[i] = Request{PromptTokens: in, OutputTokens: out, PromptSeed: rng.Uint64()}
	}
	return d
}

// UseCase is one kind of request in the usecase mix.
type UseCase struct {
	// Name labels the request in per-use-case reports.
	Name string
	// InputTokens and OutputTokens are the nominal lengths; DatasetConfig's
	// RandomRangeRatio spreads them.
	InputTokens, OutputTokens int
	// Weight is the relative frequency in the mix.
	Weight float64
}

// UseCases is the mixed workload of calibration.md row A: five kinds of
// request with the output lengths of that measurement (~15, ~60, ~100, ~150,
// ~400 tokens), in equal shares. Prompt lengths are not published; these are
// typical of each kind.
func UseCases() []UseCase {
	return []UseCase{
		{Name: "ultra-short-qa", InputTokens: 16, OutputTokens: 15, Weight: 1},
		{Name: "short-qa", InputTokens: 48, OutputTokens: 60, Weight: 1},
		{Name: "code", InputTokens: 256, OutputTokens: 100, Weight: 1},
		{Name: "medium", InputTokens: 128, OutputTokens: 150, Weight: 1},
		{Name: "long-form", InputTokens: 64, OutputTokens: 400, Weight: 1},
	}
}

// UseCaseDataset draws c.NumPrompts requests from UseCases by weight, each
// labelled with its use case.
func UseCaseDataset(c DatasetConfig, rng *rand.Rand) *Dataset {
	cases := UseCases()
	var total float64
	for _, uc := range cases {
		total += uc.Weight
	}
	n := c.numPrompts()
	d := &Dataset{Name: DatasetUseCase, Requests: make([]Request, n)}
	for i := range d.Requests {
		x := rng.Float64() * total
		uc := cases[len(cases)-1]
		for _, u := range cases {
			if x < u.Weight {
				uc = u
				break
			}
			x -= u.Weight
		}
		d.Requests[i] = Request{
			PromptTokens: rangeLen(rng, uc.InputTokens, c.RandomRangeRatio, 1),
			OutputTokens: rangeLen(rng, uc.OutputTokens, c.RandomRangeRatio, 1),
			PromptSeed:   rng.Uint64(),
			UseCase:      uc.Name,
		}
	}
	return d
}
