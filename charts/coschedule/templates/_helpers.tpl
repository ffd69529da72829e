{{/* Labels of every object: the kustomize base's, plus Helm's own. */}}
{{- define "coschedule.labels" -}}
app.kubernetes.io/name: coschedule
app.kubernetes.io/part-of: coschedule
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end }}

{{/* Pod and selector labels: exactly the kustomize base's (selectors are immutable). */}}
{{- define "coschedule.selector" -}}
app.kubernetes.io/name: coschedule
app.kubernetes.io/component: {{ . }}
{{- end }}

{{- define "coschedule.image" -}}
{{- $image := .Values.image -}}
{{- if $image.digest -}}
{{ $image.repository }}@{{ $image.digest }}
{{- else -}}
{{ $image.repository }}:{{ $image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* Placement of a pod: priorityClassName, nodeSelector, tolerations, affinity. */}}
{{- define "coschedule.placement" -}}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Pod and container securityContext: the values' (podSecurityContext and
containerSecurityContext), the kustomize base's by default. A key set to null in a values
file is dropped, so OpenShift's restricted-v2 can assign the UID from the namespace's range. */}}
{{- define "coschedule.podSecurityContext" -}}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "coschedule.containerSecurityContext" -}}
{{- with .Values.containerSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* A pod template's metadata: its selector labels (which podLabels cannot replace: they
are the Deployment's immutable selector) and podAnnotations. Given (dict "component" C
"values" V), V holding podLabels and podAnnotations. */}}
{{- define "coschedule.podMetadata" -}}
{{- $selector := include "coschedule.selector" .component | fromYaml }}
metadata:
  {{- with .values.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  labels:
    {{- merge $selector (.values.podLabels | default dict) | toYaml | nindent 4 }}
{{- end }}

{{- define "coschedule.spread" -}}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "coschedule.selector" . | nindent 8 }}
    matchLabelKeys: [pod-template-hash]
{{- end }}

{{- define "coschedule.probes" -}}
# Liveness waits until the process first answers: its start takes seconds, far more on a
# loaded node (up to 2 minutes here), and a liveness kill then only starts it again.
startupProbe:
  httpGet:
    path: /livez
    port: health
    scheme: HTTP
  periodSeconds: 2
  timeoutSeconds: 2
  failureThreshold: 60
livenessProbe:
  httpGet:
    path: /livez
    port: health
    scheme: HTTP
  periodSeconds: 10
  timeoutSeconds: 2
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: health
    scheme: HTTP
  periodSeconds: 5
  timeoutSeconds: 2
  failureThreshold: 2
{{- end }}

{{- define "coschedule.configValue" -}}
{{- if or (kindIs "map" .) (kindIs "slice" .) -}}
{{ toYaml . | quote }}
{{- else -}}
{{ toString . | quote }}
{{- end -}}
{{- end }}
