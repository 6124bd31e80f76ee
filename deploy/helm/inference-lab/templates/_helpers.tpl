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

{{/* The engine's probe: its gRPC health answers on localhost within 4 s (SERVING or
     NOT_SERVING: a stall fault or a drain is not a dead engine). */}}
{{- define "inference-lab.engineHealth" -}}
{{- $code := printf "import grpc; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; g.HealthStub(grpc.insecure_channel('127.0.0.1:%v')).Check(h.HealthCheckRequest(), timeout=4)" .Values.ports.grpc -}}
{{- list "python" "-c" $code | toJson -}}
{{- end -}}
