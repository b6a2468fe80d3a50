{{/* Names and labels. */}}
{{- define "gpurouter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpurouter.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gpurouter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpurouter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gpurouter.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "gpurouter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "gpurouter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpurouter.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
gpurouter.config: the router's configuration file as rendered into the
ConfigMap: .Values.config with listen set to the container port and every
Kubernetes discovery source's namespace named (the release's by default).
*/}}
{{- define "gpurouter.config" -}}
{{- $cfg := deepCopy (.Values.config | default dict) }}
{{- $_ := set $cfg "listen" (printf "0.0.0.0:%v" .Values.containerPort) }}
{{- range $p := $cfg.pools | default list }}
{{- $k := (($p | default dict).discovery | default dict).kubernetes }}
{{- if and $k (not $k.namespace) }}
{{- /* Named, so the file says where it looks, as the Role does. */}}
{{- $_ := set $k "namespace" $.Release.Namespace }}
{{- end }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/*
gpurouter.seconds: a Go duration string ("30s", "1m30s", "1.5h", "500ms")
as whole seconds, rounded up; fails on anything else, as the router would.
*/}}
{{- define "gpurouter.seconds" -}}
{{- $d := toString . }}
{{- if not (regexMatch "^([0-9]+(\\.[0-9]+)?(h|ms|m|s|us|µs|ns))+$" $d) }}
{{- if ne $d "0" }}
{{- fail (printf "config.shutdown.drain_timeout %q: want a duration with a unit, e.g. 30s" $d) }}
{{- end }}
{{- end }}
{{- $total := 0.0 }}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(h|ms|m|s|us|µs|ns)" $d -1 }}
{{- $num := regexFind "^[0-9]+(\\.[0-9]+)?" . }}
{{- $unit := trimPrefix $num . }}
{{- $mult := dict "h" 3600.0 "m" 60.0 "s" 1.0 "ms" 0.001 "us" 0.000001 "µs" 0.000001 "ns" 0.000000001 }}
{{- $total = addf $total (mulf (float64 $num) (get $mult $unit)) }}
{{- end }}
{{- ceil $total | int }}
{{- end }}

{{/* gpurouter.drainSeconds: config.shutdown.drain_timeout (default 30s) in seconds. */}}
{{- define "gpurouter.drainSeconds" -}}
{{- $sd := (.Values.config | default dict).shutdown | default dict }}
{{- include "gpurouter.seconds" (get $sd "drain_timeout" | default "30s") }}
{{- end }}

{{/*
gpurouter.rbacRules: what the configured Kubernetes discovery reads, as
YAML {namespace: {pods: true, endpointslices: true, inferencepools: true}}:
per namespace only the resources some pool's source there watches.
*/}}
{{- define "gpurouter.rbacRules" -}}
{{- $out := dict }}
{{- range $i, $p := (.Values.config | default dict).pools | default list }}
{{- $k := (($p | default dict).discovery | default dict).kubernetes }}
{{- if $k }}
{{- $ns := $k.namespace | default $.Release.Namespace }}
{{- $r := get $out $ns | default dict }}
{{- if $k.selector }}{{ $_ := set $r "pods" true }}{{ end }}
{{- if $k.service }}{{ $_ := set $r "endpointslices" true }}{{ end }}
{{- if $k.inference_pool }}{{ $_ := set $r "inferencepools" true }}{{ $_ := set $r "pods" true }}{{ end }}
{{- $_ := set $out $ns $r }}
{{- end }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/*
gpurouter.tracingEnv: the router container's environment for tracing
(values.tracing), only while config.tracing.endpoint is set: the pod's
Kubernetes identity as resource attributes, and the export headers from a
Secret. The OpenTelemetry SDK reads both variables beneath the file's
options. Kubernetes expands $(VAR) from the variables listed before.
*/}}
{{- define "gpurouter.tracingEnv" -}}
{{- $cfg := (.Values.config | default dict).tracing | default dict }}
{{- $t := .Values.tracing | default dict }}
{{- if $cfg.endpoint }}
{{- if $t.kubernetesAttributes }}
- name: GPUROUTER_POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: GPUROUTER_POD_UID
  valueFrom:
    fieldRef:
      fieldPath: metadata.uid
- name: GPUROUTER_POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: GPUROUTER_NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: OTEL_RESOURCE_ATTRIBUTES
  value: k8s.pod.name=$(GPUROUTER_POD_NAME),k8s.pod.uid=$(GPUROUTER_POD_UID),k8s.namespace.name=$(GPUROUTER_POD_NAMESPACE),k8s.node.name=$(GPUROUTER_NODE_NAME)
{{- end }}
{{- with ($t.headersSecret | default dict) }}
{{- if .name }}
{{- if $cfg.headers }}
{{- fail "tracing.headersSecret and config.tracing.headers: set one (the file's headers would replace the Secret's)" }}
{{- end }}
- name: OTEL_EXPORTER_OTLP_TRACES_HEADERS
  valueFrom:
    secretKeyRef:
      name: {{ .name | quote }}
      key: {{ .key | default "headers" | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
