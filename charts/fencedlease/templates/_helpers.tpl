{{/* Chart name. */}}
{{- define "fencedlease.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified prefix of every resource name. */}}
{{- define "fencedlease.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "fencedlease.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "fencedlease.labels" -}}
helm.sh/chart: {{ include "fencedlease.chart" . }}
{{ include "fencedlease.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: fencedlease
{{- end -}}

{{- define "fencedlease.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fencedlease.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "fencedlease.image" -}}
{{- include "fencedlease.imageRef" (dict "image" .Values.image "tag" .Chart.AppVersion) -}}
{{- end -}}

{{/* An image reference: repository@digest when image.digest is set (the tag is then ignored),
     else repository:tag. Args: dict "image" (repository, tag, digest) "tag" default tag. */}}
{{- define "fencedlease.imageRef" -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (default .tag .image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The Pods' imagePullSecrets: global.imagePullSecrets (an umbrella chart's) then
     imagePullSecrets, without repeats; an entry is {name: ...} or a plain name. Renders the
     whole `imagePullSecrets:` key, or nothing. */}}
{{- define "fencedlease.imagePullSecrets" -}}
{{- $global := (.Values.global | default dict).imagePullSecrets | default list -}}
{{- $secrets := list -}}
{{- range (concat $global (.Values.imagePullSecrets | default list)) -}}
{{- $entry := . -}}
{{- if kindIs "string" . -}}{{- $entry = dict "name" . -}}{{- end -}}
{{- if not (has $entry $secrets) -}}{{- $secrets = append $secrets $entry -}}{{- end -}}
{{- end -}}
{{- with $secrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end -}}
{{- end -}}

{{/* A component's priorityClassName, else global.priorityClassName. Renders the key or nothing.
     Args: dict "ctx" . "value" the component's. */}}
{{- define "fencedlease.priorityClassName" -}}
{{- with default ((.ctx.Values.global | default dict).priorityClassName) .value }}
priorityClassName: {{ . }}
{{- end -}}
{{- end -}}

{{/* A component's topologySpreadConstraints; one without a labelSelector gets the component's
     Pods' labels. Args: dict "constraints" list "selector" matchLabels (YAML). */}}
{{- define "fencedlease.topologySpread" -}}
{{- $out := list -}}
{{- range .constraints -}}
{{- $c := deepCopy . -}}
{{- if not (hasKey $c "labelSelector") -}}
{{- $_ := set $c "labelSelector" (dict "matchLabels" (fromYaml $.selector)) -}}
{{- end -}}
{{- $out = append $out $c -}}
{{- end -}}
{{- with $out }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end -}}
{{- end -}}

{{/* The two ServiceAccounts: <serviceAccount.name>-controller and -webhook (default: the full
     name as the base). */}}
{{- define "fencedlease.serviceAccountBase" -}}
{{- default (include "fencedlease.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "fencedlease.controllerServiceAccount" -}}
{{- printf "%s-controller" (include "fencedlease.serviceAccountBase" .) -}}
{{- end -}}

{{- define "fencedlease.webhookServiceAccount" -}}
{{- printf "%s-webhook" (include "fencedlease.serviceAccountBase" .) -}}
{{- end -}}

{{- define "fencedlease.webhookServiceName" -}}
{{- printf "%s-webhook" (include "fencedlease.fullname" .) -}}
{{- end -}}

{{/* Name of the MutatingWebhookConfiguration (cluster-scoped: includes the release namespace). */}}
{{- define "fencedlease.webhookConfigurationName" -}}
{{- printf "%s.%s.fencedlease.io" (include "fencedlease.fullname" .) .Release.Namespace | trunc 253 -}}
{{- end -}}

{{- define "fencedlease.webhookSecretName" -}}
{{- if and (not .Values.certManager.enabled) .Values.webhook.tls.secretName -}}
{{- .Values.webhook.tls.secretName -}}
{{- else -}}
{{- printf "%s-webhook-tls" (include "fencedlease.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "fencedlease.etcdName" -}}
{{- printf "%s-etcd" (include "fencedlease.fullname" .) -}}
{{- end -}}

{{- define "fencedlease.etcdClientSecretName" -}}
{{- if .Values.etcd.bundled.enabled -}}
{{- printf "%s-etcd-client-tls" (include "fencedlease.fullname" .) -}}
{{- else -}}
{{- .Values.etcd.tls.secretName -}}
{{- end -}}
{{- end -}}

{{/* Comma-separated etcd client URLs. */}}
{{- define "fencedlease.etcdEndpoints" -}}
{{- if .Values.etcd.bundled.enabled -}}
{{- $name := include "fencedlease.etcdName" . -}}
{{- $urls := list -}}
{{- range $i := until (int .Values.etcd.bundled.replicas) -}}
{{- $urls = append $urls (printf "https://%s-%d.%s-headless.%s.svc:2379" $name $i $name $.Release.Namespace) -}}
{{- end -}}
{{- join "," $urls -}}
{{- else -}}
{{- if not .Values.etcd.endpoints -}}
{{- fail "etcd.endpoints is required when etcd.bundled.enabled is false" -}}
{{- end -}}
{{- join "," .Values.etcd.endpoints -}}
{{- end -}}
{{- end -}}

{{/* Environment common to both roles. */}}
{{- define "fencedlease.commonEnv" -}}
- name: FENCEDLEASE_ETCD_ENDPOINTS
  value: {{ include "fencedlease.etcdEndpoints" . | quote }}
- name: FENCEDLEASE_ETCD_PREFIX
  value: {{ .Values.etcd.prefix | quote }}
{{- if include "fencedlease.etcdClientSecretName" . }}
- name: FENCEDLEASE_ETCD_CA_FILE
  value: /etc/fencedlease/etcd/ca.crt
- name: FENCEDLEASE_ETCD_CERT_FILE
  value: /etc/fencedlease/etcd/tls.crt
- name: FENCEDLEASE_ETCD_KEY_FILE
  value: /etc/fencedlease/etcd/tls.key
{{- end }}
- name: FENCEDLEASE_HEALTH_ETCD_LIVENESS_SECONDS
  value: {{ .Values.health.etcdLivenessSeconds | quote }}
- name: FENCEDLEASE_HEALTH_ETCD_READINESS_SECONDS
  value: {{ .Values.health.etcdReadinessSeconds | quote }}
- name: FENCEDLEASE_HEALTH_SCHEDULER_STALL_SECONDS
  value: {{ .Values.health.schedulerStallSeconds | quote }}
- name: FENCEDLEASE_HEALTH_WATCH_GRACE_SECONDS
  value: {{ .Values.health.watchGraceSeconds | quote }}
- name: FENCEDLEASE_CLOCK_SKEW_SECONDS
  value: {{ .Values.clockSkewSeconds | quote }}
- name: FENCEDLEASE_TOKEN_RETENTION_GENERATIONS
  value: {{ .Values.etcd.retention.tokenGenerations | quote }}
- name: FENCEDLEASE_DELETED_LEASE_RETENTION_SECONDS
  value: {{ .Values.etcd.retention.deletedLeaseSeconds | quote }}
- name: FENCEDLEASE_ALLOWED_WRITERS
  value: {{ join "," .Values.allowedWriters | quote }}
- name: FENCEDLEASE_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
- name: FENCEDLEASE_WEBHOOK_REGISTRATION
  value: none
- name: FENCEDLEASE_WEBHOOK_CONFIGURATION_NAME
  value: {{ include "fencedlease.webhookConfigurationName" . | quote }}
{{- with .Values.watchNamespace }}
- name: FENCEDLEASE_NAMESPACE
  value: {{ . | quote }}
{{- end }}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end -}}

{{- define "fencedlease.etcdClientVolume" -}}
{{- if include "fencedlease.etcdClientSecretName" . }}
- name: etcd-client-tls
  secret:
    secretName: {{ include "fencedlease.etcdClientSecretName" . }}
{{- end }}
{{- end -}}

{{- define "fencedlease.etcdClientVolumeMount" -}}
{{- if include "fencedlease.etcdClientSecretName" . }}
- name: etcd-client-tls
  mountPath: /etc/fencedlease/etcd
  readOnly: true
{{- end }}
{{- end -}}

{{/* Generate, keep or renew (on install/upgrade, through lookup) a CA and a leaf certificate.
     Args: dict "ctx" . "secret" name "caSecret" name "cn" cn "dns" list "ips" list "days" n
     "renewDays" n "caDays" n "caName" name.
     The CA's key lives in caSecret (mounted by no Pod). Each Secret carries its certificate's
     expiry (annotation fencedlease.io/not-after, Unix seconds): Sprig cannot parse a
     certificate. The leaf is kept until fewer than renewDays are left, then signed anew by the
     same CA (the caBundle does not change, so no Pod serves a certificate the API server does
     not trust while the kubelet refreshes the mounted Secret). The CA is replaced when it would
     expire before a new leaf, or when there is no CA key (a release of an older chart): the
     bundle then trusts the old CA too, until the next upgrade.
     Returns YAML with base64 bundle, ca, caKey, crt, key and Unix seconds caNotAfter, notAfter. */}}
{{- define "fencedlease.genCerts" -}}
{{- if ge (int .renewDays) (int .days) -}}
{{- fail "webhook.tls.renewBeforeDays must be below webhook.tls.validityDays (every upgrade would renew)" -}}
{{- end -}}
{{- if le (int .caDays) (add .days .renewDays) -}}
{{- fail "webhook.tls.caValidityDays must exceed validityDays + renewBeforeDays (the CA must outlive its certificates)" -}}
{{- end -}}
{{- $ns := .ctx.Release.Namespace -}}
{{- $day := 86400 -}}
{{- $now := now | unixEpoch | int64 -}}
{{- $old := (lookup "v1" "Secret" $ns .secret) | default dict -}}
{{- $oldData := $old.data | default dict -}}
{{- $oldNotAfter := index (($old.metadata | default dict).annotations | default dict) "fencedlease.io/not-after" | default "0" | int64 -}}
{{- $oldCA := (lookup "v1" "Secret" $ns .caSecret) | default dict -}}
{{- $oldCAData := $oldCA.data | default dict -}}
{{- $oldCANotAfter := index (($oldCA.metadata | default dict).annotations | default dict) "fencedlease.io/not-after" | default "0" | int64 -}}
{{- $ca := dict -}}
{{- $caNotAfter := $oldCANotAfter -}}
{{- $caRotated := false -}}
{{- if and (hasKey $oldCAData "tls.crt") (hasKey $oldCAData "tls.key") (gt $oldCANotAfter (add $now (mul (add (int .days) (int .renewDays)) $day))) -}}
{{- $ca = buildCustomCert (index $oldCAData "tls.crt") (index $oldCAData "tls.key") -}}
{{- else -}}
{{- /* ECDSA P-256 keys: a TLS handshake costs the server one P-256 signature instead of an
     RSA-2048 one (several times the CPU); the API server's idle-pool churn makes handshakes
     frequent under load (docs/performance.md, "Item 3"). */ -}}
{{- $ca = genCAWithKey .caName (int .caDays) (genPrivateKey "ecdsa") -}}
{{- $caNotAfter = add $now (mul (int .caDays) $day) -}}
{{- $caRotated = true -}}
{{- end -}}
{{- $bundle := $ca.Cert -}}
{{- if and $caRotated (hasKey $oldData "ca.crt") -}}
{{- $previous := index $oldData "ca.crt" | b64dec -}}
{{- if ne (trim $previous) (trim $ca.Cert) -}}
{{- $bundle = printf "%s\n%s" (trim $ca.Cert) (trim $previous) -}}
{{- end -}}
{{- end -}}
bundle: {{ $bundle | b64enc }}
ca: {{ $ca.Cert | b64enc }}
caKey: {{ $ca.Key | b64enc }}
caNotAfter: {{ $caNotAfter | quote }}
{{- if and (not $caRotated) (hasKey $oldData "tls.crt") (hasKey $oldData "tls.key") (gt $oldNotAfter (add $now (mul (int .renewDays) $day))) }}
crt: {{ index $oldData "tls.crt" }}
key: {{ index $oldData "tls.key" }}
notAfter: {{ $oldNotAfter | quote }}
{{- else }}
{{- $cert := genSignedCertWithKey .cn (.ips | default list) (.dns | default list) (int .days) $ca (genPrivateKey "ecdsa") }}
crt: {{ $cert.Cert | b64enc }}
key: {{ $cert.Key | b64enc }}
notAfter: {{ add $now (mul (int .days) $day) | quote }}
{{- end -}}
{{- end -}}

{{/* The webhook's serving-certificate Secret and its CA's Secret, from fencedlease.genCerts.
     Args: dict "ctx" . "secret" name "certs" (genCerts output). */}}
{{- define "fencedlease.webhookTLSSecrets" -}}
apiVersion: v1
kind: Secret
metadata:
  name: {{ .secret }}
  namespace: {{ .ctx.Release.Namespace }}
  labels:
    {{- include "fencedlease.labels" .ctx | nindent 4 }}
    app.kubernetes.io/component: webhook
  annotations:
    fencedlease.io/not-after: {{ .certs.notAfter | quote }}
type: kubernetes.io/tls
data:
  ca.crt: {{ .certs.ca }}
  tls.crt: {{ .certs.crt }}
  tls.key: {{ .certs.key }}
---
# The CA that signs the webhook's serving certificate (helm upgrade renews it from this key).
# No Pod mounts it; keep it as secret as the serving key.
apiVersion: v1
kind: Secret
metadata:
  name: {{ .secret }}-ca
  namespace: {{ .ctx.Release.Namespace }}
  labels:
    {{- include "fencedlease.labels" .ctx | nindent 4 }}
    app.kubernetes.io/component: webhook
  annotations:
    fencedlease.io/not-after: {{ .certs.caNotAfter | quote }}
type: kubernetes.io/tls
data:
  tls.crt: {{ .certs.ca }}
  tls.key: {{ .certs.caKey }}
{{- end -}}

{{/* Secret holding the key that signs lease statuses (kept across upgrades and uninstall). */}}
{{- define "fencedlease.authoritySecretName" -}}
{{ include "fencedlease.fullname" . }}-authority
{{- end -}}
