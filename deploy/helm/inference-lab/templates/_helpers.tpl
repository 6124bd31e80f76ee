{{- define "inference-lab.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "inference-lab.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "inference-lab.labels" -}}
{{ include "inference-lab.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The Secret holding the lab's secrets: the one named, or the chart's own when values
     are given; empty when there is none. */}}
{{- define "inference-lab.secretName" -}}
{{- if .Values.auth.existingSecret -}}
{{- .Values.auth.existingSecret -}}
{{- else if or .Values.auth.apiKey .Values.auth.controlToken -}}
{{- printf "%s-secrets" (include "inference-lab.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Both secrets as the variables every command reads (either key may be absent). */}}
{{- define "inference-lab.secretEnv" -}}
{{- $secret := include "inference-lab.secretName" . -}}
{{- if $secret -}}
env:
  - name: INFERENCE_LAB_API_KEY
    valueFrom:
      secretKeyRef: {name: {{ $secret }}, key: api-key, optional: true}
  - name: INFERENCE_LAB_CONTROL_TOKEN
    valueFrom:
      secretKeyRef: {name: {{ $secret }}, key: control-token, optional: true}
{{- end }}
{{- end -}}

{{/* The engine's probe: its gRPC health on localhost port .port answers within 4 s
     (SERVING or NOT_SERVING: a stall fault or a drain is not a dead engine). */}}
{{- define "inference-lab.engineHealth" -}}
{{- $code := printf "import grpc; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; g.HealthStub(grpc.insecure_channel('127.0.0.1:%v')).Check(h.HealthCheckRequest(), timeout=4)" .port -}}
{{- list "python" "-c" $code | toJson -}}
{{- end -}}

{{/* The ports the data-parallel ranks take: rank r's gRPC on ports.grpc + 10 r, its
     metrics on ports.engineMetrics + 10 r (rank 0: the ports of a pod without ranks). */}}
{{- define "inference-lab.rankPortStride" -}}10{{- end -}}

{{/* The gateway's ports beyond `http` (ports.http + i for i = 1 ..): P/D's replica-i, or
     with external data-parallel balancing rank-i; a JSON list of [name, offset]. */}}
{{- define "inference-lab.extraPorts" -}}
{{- $out := list -}}
{{- if .Values.pd.enabled -}}
{{- range $i := until (int (add .Values.pd.prefill .Values.pd.decode)) -}}
{{- if $i -}}{{- $out = append $out (list (printf "replica-%d" $i) $i) -}}{{- end -}}
{{- end -}}
{{- else if and (gt (int .Values.dataParallel.size) 1) (eq .Values.dataParallel.loadBalancing "external") -}}
{{- range $i := until (int .Values.dataParallel.size) -}}
{{- if $i -}}{{- $out = append $out (list (printf "rank-%d" $i) $i) -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- $out | toJson -}}
{{- end -}}

{{/* Values that contradict one another fail the render, naming them; renders nothing. */}}
{{- define "inference-lab.checkValues" -}}
{{- $size := int .Values.dataParallel.size -}}
{{- $api := int .Values.apiServerCount -}}
{{- if or (lt $size 1) (gt $size 64) -}}
{{- fail (printf "dataParallel.size must be an integer in 1..64, got %v" .Values.dataParallel.size) -}}
{{- end -}}
{{- if not (has .Values.dataParallel.loadBalancing (list "internal" "external")) -}}
{{- fail (printf "dataParallel.loadBalancing must be internal or external, got %v" .Values.dataParallel.loadBalancing) -}}
{{- end -}}
{{- if or (lt $api 1) (gt $api 64) -}}
{{- fail (printf "apiServerCount must be an integer in 1..64, got %v" .Values.apiServerCount) -}}
{{- end -}}
{{- if and .Values.pd.enabled (gt $size 1) -}}
{{- fail (printf "pd.enabled with dataParallel.size %d: choose one. P/D's prefill and decode replicas (pd.prefill, pd.decode) are independent servers in one engine, not data-parallel ranks; set dataParallel.size to 1, and replicaCount for more pods" $size) -}}
{{- end -}}
{{- if and (gt $size 1) (eq 0 (int (mod (sub (int .Values.ports.engineMetrics) (int .Values.ports.grpc)) (int (include "inference-lab.rankPortStride" .))))) -}}
{{- fail (printf "ports.grpc %v and ports.engineMetrics %v: with dataParallel.size > 1 rank r takes each + %s r, so they must not differ by a multiple of %s" .Values.ports.grpc .Values.ports.engineMetrics (include "inference-lab.rankPortStride" .) (include "inference-lab.rankPortStride" .)) -}}
{{- end -}}
{{- with .Values.kvOffloading -}}
{{- if and .size (not (has (kindOf .size) (list "float64" "int" "int64"))) -}}
{{- fail (printf "kvOffloading.size must be a number of GiB > 0 (or null: off), got %v" .size) -}}
{{- end -}}
{{- if and .size (lt (float64 .size) 0.0) -}}
{{- fail (printf "kvOffloading.size must be a number of GiB > 0 (or null: off), got %v" .size) -}}
{{- end -}}
{{- if not (has (.backend | default "native") (list "native" "lmcache")) -}}
{{- fail (printf "kvOffloading.backend must be native or lmcache, got %v" .backend) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.inferencePool.enabled (gt $size 8) (eq .Values.dataParallel.loadBalancing "external") -}}
{{- fail (printf "inferencePool.enabled with dataParallel.size %d and external balancing: an InferencePool lists at most 8 target ports (one per rank)" $size) -}}
{{- end -}}
{{- end -}}
