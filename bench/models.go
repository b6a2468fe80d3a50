package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// ErrNoModels is returned by FirstModel when the server lists none.
var ErrNoModels = errors.New("bench: server lists no models")

// FirstModel asks baseURL's GET /v1/models for the first model id, which is
// what vllm bench uses when --model is not given.
func FirstModel(ctx context.Context, baseURL string, headers map[string]string) (string, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(strings.TrimRight(baseURL, "/") + "/v1/models")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	deadline := time.Now().Add(10 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c := &fasthttp.Client{Name: "gpurouter-bench"}
	if err := c.DoDeadline(req, resp, deadline); err != nil {
		return "", fmt.Errorf("bench: GET /v1/models: %w", err)
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return "", fmt.Errorf("bench: GET /v1/models: status %d", resp.StatusCode())
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(resp.Body(), &list); err != nil {
		return "", fmt.Errorf("bench: GET /v1/models: %w", err)
	}
	if len(list.Data) == 0 || list.Data[0].ID == "" {
		return "", ErrNoModels
	}
	return list.Data[0].ID, nil
}
