{{/* The prefix of every resource's name. */}}
{{- define "fastserve.fullname" -}}
{{- default .Release.Name .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every resource; "component" is scheduler, worker or kvstore. */}}
{{- define "fastserve.labels" -}}
app.kubernetes.io/name: fastserve
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "fastserve.selector" -}}
app.kubernetes.io/name: fastserve
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "fastserve.image" -}}
{{- $variant := ternary "cpu" "cuda" (eq .Values.workers.device "cpu") -}}
{{- $tag := default (printf "%s-%s" .Chart.AppVersion $variant) .Values.image.tag -}}
{{ printf "%s:%s" .Values.image.repository $tag }}
{{- end -}}

{{- define "fastserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{ default (printf "%s-scheduler" (include "fastserve.fullname" .)) .Values.serviceAccount.name }}
{{- else -}}
{{ required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end -}}
{{- end -}}

{{/* Every container: no privilege escalation, no capabilities, the image's user. */}}
{{- define "fastserve.containerSecurity" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: {{ .Values.security.runAsUser }}
  allowPrivilegeEscalation: false
  capabilities:
    drop: ["ALL"]
{{- end -}}

{{- define "fastserve.podSecurity" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: {{ .Values.security.runAsUser }}
  fsGroup: {{ .Values.security.fsGroup }}
{{- end -}}

{{/* TLS flags: the mounted Secret's files, or --insecure (plaintext on the pod network). */}}
{{- define "fastserve.tlsArgs" -}}
{{- if .Values.security.tlsSecret -}}
- --tls-cert=/etc/fastserve/tls/tls.crt
- --tls-key=/etc/fastserve/tls/tls.key
- --tls-ca=/etc/fastserve/tls/ca.crt
{{- else -}}
- --insecure
{{- end -}}
{{- end -}}

{{/* The TLS Secret's mount and volume ("" without one: call through `with`). */}}
{{- define "fastserve.tlsVolumeMount" -}}
{{- if .Values.security.tlsSecret -}}
- {name: tls, mountPath: /etc/fastserve/tls, readOnly: true}
{{- end -}}
{{- end -}}

{{- define "fastserve.tlsVolume" -}}
{{- if .Values.security.tlsSecret -}}
- {name: tls, secret: {secretName: {{ .Values.security.tlsSecret }}}}
{{- end -}}
{{- end -}}

{{/* The model cache: a claim, or an emptyDir. */}}
{{- define "fastserve.modelCacheVolume" -}}
{{- if .Values.model.cache.existingClaim -}}
- {name: model-cache, persistentVolumeClaim: {claimName: {{ .Values.model.cache.existingClaim }}}}
{{- else -}}
- {name: model-cache, emptyDir: {}}
{{- end -}}
{{- end -}}

{{/* A gRPC health probe: Kubernetes' own where the server has it (1.24+) and the port is
plaintext, else an exec of the image's probe command (fastserve.probe, which speaks TLS). */}}
{{- define "fastserve.grpcProbe" -}}
{{- if and (semverCompare ">=1.24-0" .root.Capabilities.KubeVersion.Version) (not .root.Values.security.tlsSecret) -}}
grpc:
  port: {{ .port }}
{{- else -}}
exec:
  command:
    - python
    - -m
    - fastserve.probe
    - 127.0.0.1:{{ .port }}
    {{- if .root.Values.security.tlsSecret }}
    - --tls-dir=/etc/fastserve/tls
    {{- end }}
{{- end -}}
{{- end -}}

{{/* The StatefulSet's worker addresses, for the scheduler's --workers. */}}
{{- define "fastserve.workerAddresses" -}}
{{- $name := include "fastserve.fullname" . -}}
{{- $addrs := list -}}
{{- range $i := until (int .Values.workers.replicas) -}}
{{- $addrs = append $addrs (printf "%s-worker-%d.%s-worker.%s.svc:%d" $name $i $name $.Release.Namespace (int $.Values.workers.port)) -}}
{{- end -}}
{{ join "," $addrs }}
{{- end -}}
