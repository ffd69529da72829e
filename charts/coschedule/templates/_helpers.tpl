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

{{- define "coschedule.podSecurityContext" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  fsGroup: 65532
  seccompProfile:
    type: RuntimeDefault
{{- end }}

{{- define "coschedule.containerSecurityContext" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  capabilities:
    drop: [ALL]
  seccompProfile:
    type: RuntimeDefault
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
