{{/* The chart's name, or nameOverride. */}}
{{- define "tolerable.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Objects' names: the release name when it already says tolerable (a release named
tolerable gives kustomize/base's names), else <release>-tolerable; or fullnameOverride. At most
55 characters, so that the Services named <fullname>-metrics and <fullname>-valkey stay within
the 63 of a Service name (and the CA's common name <fullname>-ca within cert-manager's 64). */}}
{{- define "tolerable.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 55 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "tolerable.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 55 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 55 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The labels selecting tolerable's Pods: fixed for a release's life (selectors are immutable). */}}
{{- define "tolerable.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tolerable.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end -}}

{{/* Every object's labels. */}}
{{- define "tolerable.labels" -}}
app.kubernetes.io/name: {{ include "tolerable.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: tolerable
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/* The image: repository@digest when a digest is given, else repository:tag (v<appVersion>). */}}
{{- define "tolerable.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default (printf "v%s" .Chart.AppVersion) .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Whether a feature that needs the API is on in `config`, with tolerable's own defaults when
the key is unset: read_pull_secrets, nodes.watch, nodes.manage_taints. */}}
{{- define "tolerable.readsPullSecrets" -}}
{{- if dig "credentials" "read_pull_secrets" true .Values.config }}true{{ end -}}
{{- end -}}
{{- define "tolerable.watchesNodes" -}}
{{- if dig "nodes" "watch" true .Values.config }}true{{ end -}}
{{- end -}}
{{- define "tolerable.readsNamespacePolicy" -}}
{{- if dig "policy" "namespace_policy" true .Values.config }}true{{ end -}}
{{- end -}}
{{- define "tolerable.managesTaints" -}}
{{- if dig "nodes" "manage_taints" false .Values.config }}true{{ end -}}
{{- end -}}
{{/* Whether admissions write Warning Events on Pods' owners ([events] on_admission,
kustomize/components/events). */}}
{{- define "tolerable.ownerEvents" -}}
{{- if dig "events" "on_admission" false .Values.config }}true{{ end -}}
{{- end -}}
{{/* Whether serve watches for wrong-architecture crashes ([crashes] watch,
kustomize/components/crash-watch). */}}
{{- define "tolerable.crashWatch" -}}
{{- if dig "crashes" "watch" false .Values.config }}true{{ end -}}
{{- end -}}
{{/* Whether the crash watch deletes the Pods of wrong-architecture crashes ([crashes] heal,
kustomize/components/crash-heal). */}}
{{- define "tolerable.crashHeal" -}}
{{- if and (include "tolerable.crashWatch" .) (dig "crashes" "heal" false .Values.config) }}true{{ end -}}
{{- end -}}
{{/* Whether Pods are gated when their images cannot be looked up (policy.on_lookup_failure =
"gate"): then serve releases them, one replica elected on a Lease (kustomize/components/gates). */}}
{{- define "tolerable.gates" -}}
{{- if eq (toString (dig "policy" "on_lookup_failure" "allow" .Values.config)) "gate" }}true{{ end -}}
{{- end -}}

{{/* `config` as TOML: one table per section. Not Helm's toToml: numbers read from YAML reach
templates as float64, which toToml writes as floats (1000.0) where tolerable.toml has integers. */}}
{{- define "tolerable.toml" -}}
{{- range $section, $keys := . }}
{{- if not (kindIs "map" $keys) }}
{{- fail (printf "config.%s must be a table of keys (a section of tolerable.toml)" $section) }}
{{- end }}
[{{ $section }}]
{{- range $key, $value := $keys }}
{{- if not (kindIs "invalid" $value) }}
{{ include "tolerable.tomlKey" $key }} = {{ include "tolerable.tomlValue" $value }}
{{- end }}
{{- end }}
{{ end }}
{{- end -}}

{{- define "tolerable.tomlKey" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . }}{{ . }}{{ else }}{{ toJson . }}{{ end -}}
{{- end -}}

{{/* One TOML value: strings as JSON strings (a valid TOML basic string), whole numbers as
integers, lists as arrays, maps as inline tables. */}}
{{- define "tolerable.tomlValue" -}}
{{- if kindIs "string" . -}}
{{ toJson . }}
{{- else if kindIs "bool" . -}}
{{ . }}
{{- else if kindIs "float64" . -}}
{{ if eq . (floor .) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else if or (kindIs "int" .) (kindIs "int64" .) (kindIs "uint64" .) -}}
{{ . }}
{{- else if kindIs "slice" . -}}
[{{ range $i, $v := . }}{{ if $i }}, {{ end }}{{ include "tolerable.tomlValue" $v }}{{ end }}]
{{- else if kindIs "map" . -}}
{ {{- $first := true }}{{ range $k, $v := . }}{{ if not (kindIs "invalid" $v) }}{{ if not $first }},{{ end }}{{ $first = false }} {{ include "tolerable.tomlKey" $k }} = {{ include "tolerable.tomlValue" $v }}{{ end }}{{ end }} }
{{- else -}}
{{ fail (printf "config: %v (%s) has no TOML form" . (kindOf .)) }}
{{- end -}}
{{- end -}}

{{/* The port of a listen address (host:port, [v6]:port), for the container's ports. */}}
{{- define "tolerable.port" -}}
{{- $port := regexFind "[0-9]+$" .addr -}}
{{- if not $port }}{{ fail (printf "config.%s %q has no port" .key .addr) }}{{ end -}}
{{- $port -}}
{{- end -}}

{{/* The Secret holding the serving certificate (tls.crt, tls.key): cert-manager's and Helm's
are <fullname>-tls; else the operator's. */}}
{{- define "tolerable.tlsSecretName" -}}
{{- if eq .Values.certificates.mode "existingSecret" -}}
{{- required "certificates.existingSecret.name: the Secret with tls.crt and tls.key" .Values.certificates.existingSecret.name -}}
{{- else -}}
{{- include "tolerable.fullname" . }}-tls
{{- end -}}
{{- end -}}

{{/* Kubelet credential provider plugins for tolerable (docs/cloud-registries.md), as
kustomize/components/node-credential-providers and credential-provider-image: the environment,
mounts and volumes they add to the container, as YAML ({env, volumeMounts, volumes}). */}}
{{- define "tolerable.credentialProviders" -}}
{{- $node := .Values.credentialProviders.node }}
{{- $image := .Values.credentialProviders.image }}
{{- if and $node.enabled $image.enabled }}
{{- fail "credentialProviders: node and image cannot both be enabled (one provider config)" }}
{{- end }}
{{- if $node.enabled }}
env:
  - name: TOLERABLE_CREDENTIALS__PROVIDER_CONFIG
    value: /etc/tolerable/node-credential-providers/config
  - name: TOLERABLE_CREDENTIALS__PROVIDER_BIN_DIR
    value: /etc/tolerable/node-credential-providers/bin
volumeMounts:
  - name: node-credential-provider-config
    mountPath: /etc/tolerable/node-credential-providers/config
    readOnly: true
  - name: node-credential-provider-bin
    mountPath: /etc/tolerable/node-credential-providers/bin
    readOnly: true
volumes:
  - name: node-credential-provider-config
    hostPath:
      path: {{ $node.configPath | quote }}
      type: File
  - name: node-credential-provider-bin
    hostPath:
      path: {{ $node.binDir | quote }}
      type: Directory
{{- else if $image.enabled }}
env:
  - name: TOLERABLE_CREDENTIALS__PROVIDER_CONFIG
    value: /etc/tolerable/credential-providers/credential-providers.yaml
  - name: TOLERABLE_CREDENTIALS__PROVIDER_BIN_DIR
    value: {{ $image.binDir | quote }}
volumeMounts:
  - name: credential-providers
    mountPath: /etc/tolerable/credential-providers
    readOnly: true
volumes:
  - name: credential-providers
    configMap:
      name: {{ include "tolerable.fullname" . }}-credential-providers
{{- end }}
{{- end -}}

{{/* The labels selecting the chart's Valkey (sharedCache.valkey). */}}
{{- define "tolerable.valkeyLabels" -}}
app.kubernetes.io/name: valkey
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: cache
{{- end -}}

{{/* `config`, with [shared_cache] url pointing at the chart's Valkey when it runs one and no url
is given. */}}
{{- define "tolerable.config" -}}
{{- $config := deepCopy .Values.config }}
{{- if and .Values.sharedCache.valkey.enabled (not (dig "shared_cache" "url" "" $config)) }}
{{- $section := default dict (get $config "shared_cache") }}
{{- $_ := set $section "url" (printf "redis://%s-valkey.%s.svc:6379/0" (include "tolerable.fullname" .) .Release.Namespace) }}
{{- $_ := set $config "shared_cache" $section }}
{{- end }}
{{- toJson $config }}
{{- end -}}

{{/* The Secret holding the shared cache's password, as a secretKeyRef (YAML), or nothing:
sharedCache.passwordSecret when named, else the one the chart generates for its own Valkey. */}}
{{- define "tolerable.sharedCachePassword" -}}
{{- if .Values.sharedCache.passwordSecret.name -}}
name: {{ .Values.sharedCache.passwordSecret.name | quote }}
key: {{ .Values.sharedCache.passwordSecret.key | quote }}
{{- else if .Values.sharedCache.valkey.enabled -}}
name: {{ printf "%s-valkey" (include "tolerable.fullname" .) | quote }}
key: "password"
{{- end -}}
{{- end -}}

{{/* Labels the chart sets on tolerable's Pods itself: selectors, the Service and the
NetworkPolicies rely on them, and tolerable.io/skip keeps the webhook off its own Pods. A
podLabels key among them would silently change or duplicate one. */}}
{{- define "tolerable.reservedPodLabels" -}}
{{- $reserved := keys (include "tolerable.labels" . | fromYaml) }}
{{- toJson (concat $reserved (list "app.kubernetes.io/component" "tolerable.io/skip")) }}
{{- end -}}

{{/*
The namespaces the webhook never sends (a JSON array): the release's own and kube-system (tolerable
never waits on itself, nor the control plane on it), webhook.excludeNamespaces, and
config.policy.skip_namespaces (tolerable would answer their Pods with nothing: a call saved).
*/}}
{{- define "tolerable.excludedNamespaces" -}}
{{- /* skip_namespaces is read as tolerable reads it: a list, or one comma-separated string; each name trimmed, empty ones dropped. */ -}}
{{- $skip := dig "policy" "skip_namespaces" (list) .Values.config -}}
{{- if kindIs "string" $skip }}{{ $skip = splitList "," $skip }}{{ end -}}
{{- $names := list -}}
{{- range concat (list .Release.Namespace "kube-system") .Values.webhook.excludeNamespaces $skip -}}
{{- $name := trim (toString .) -}}
{{- if $name }}{{ $names = append $names $name }}{{ end -}}
{{- end -}}
{{- $names | uniq | toJson -}}
{{- end }}
