{{/* Names and labels. */}}
{{- define "permit-gateway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "permit-gateway.fullname" -}}
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

{{- define "permit-gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "permit-gateway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "permit-gateway.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "permit-gateway.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The check-config hook's Job and ConfigMap (63 characters at most). */}}
{{- define "permit-gateway.checkConfigName" -}}
{{- printf "%s-check-config" (include "permit-gateway.fullname" . | trunc 50 | trimSuffix "-") }}
{{- end }}

{{/* The hook pod's labels: not the Deployment's selector, so no Service
or PDB of the release selects it. */}}
{{- define "permit-gateway.checkConfigSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-check-config" (include "permit-gateway.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: check-config
{{- end }}

{{- define "permit-gateway.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "permit-gateway.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "permit-gateway.secretName" -}}
{{- default (printf "%s-upstream" (include "permit-gateway.fullname" .)) .Values.upstream.existingSecret }}
{{- end }}

{{/* repository:tag, pinned with @digest when image.digest is set. */}}
{{- define "permit-gateway.image" -}}
{{- $ref := printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- with .Values.image.digest }}
{{- if not (regexMatch "^sha256:[0-9a-f]{64}$" .) }}
{{- fail (printf "permit-gateway: image.digest must be sha256:<64 hex digits>, got %q" .) }}
{{- end }}
{{- $ref = printf "%s@%s" $ref . }}
{{- end }}
{{- $ref }}
{{- end }}

{{/* A tag alone may be re-pushed: pull it at every start. A digest cannot
change: leave Kubernetes' default (IfNotPresent). image.pullPolicy wins. */}}
{{- define "permit-gateway.pullPolicy" -}}
{{- .Values.image.pullPolicy | default (ternary "" "Always" (not (empty .Values.image.digest))) }}
{{- end }}

{{/* Where the chart puts things inside the container. */}}
{{- define "permit-gateway.dataDir" -}}/var/lib/permit-gateway{{- end }}
{{- define "permit-gateway.keyFile" -}}/run/secrets/permit-gateway/upstream-key{{- end }}

{{- define "permit-gateway.store" -}}
{{- $quota := default dict .Values.config.quota }}
{{- default "file" $quota.store }}
{{- end }}

{{- define "permit-gateway.drainSecs" -}}
{{- $server := default dict .Values.config.server }}
{{- if hasKey $server "shutdown_grace_secs" }}{{ int64 $server.shutdown_grace_secs }}{{ else }}25{{ end }}
{{- end }}

{{- define "permit-gateway.terminationGracePeriodSeconds" -}}
{{- $drain := int64 (include "permit-gateway.drainSecs" .) }}
{{- $pre := int64 (default 0 .Values.preStopSleepSeconds) }}
{{- if .Values.terminationGracePeriodSeconds }}
{{- int64 .Values.terminationGracePeriodSeconds }}
{{- else }}
{{- add $pre $drain 10 }}
{{- end }}
{{- end }}

{{/*
Guards: refuse to render a deployment that would break budgets or cannot
start. Every message says what to set.
*/}}
{{- define "permit-gateway.validate" -}}
{{- $store := include "permit-gateway.store" . }}
{{- $cache := default dict .Values.config.cache }}
{{- $quota := default dict .Values.config.quota }}
{{- $upstream := default dict .Values.config.upstream }}
{{- if and (gt (int .Values.replicaCount) 1) (ne $store "redis") }}
{{- fail (printf "permit-gateway: replicaCount=%d requires the Redis ledger: set config.quota.store=redis (and config.cache.redis_url or redis.existingSecret). The file ledger (store=%q) is single-replica; several replicas with it would overspend team budgets." (int .Values.replicaCount) $store) }}
{{- end }}
{{- if and .Values.autoscaling.enabled (ne $store "redis") }}
{{- fail (printf "permit-gateway: autoscaling.enabled=true requires the Redis ledger: set config.quota.store=redis (and config.cache.redis_url or redis.existingSecret). The file ledger (store=%q) is single-replica." $store) }}
{{- end }}
{{- $clusterNodes := default list .Values.redis.clusterNodes }}
{{- if and (eq $store "redis") (not (or $quota.redis_url $cache.redis_url .Values.redis.existingSecret $clusterNodes)) }}
{{- fail "permit-gateway: config.quota.store=redis needs a Redis URL: set config.cache.redis_url, config.quota.redis_url, redis.existingSecret or redis.clusterNodes." }}
{{- end }}
{{- if and $clusterNodes (or $cache.redis_url .Values.redis.existingSecret) }}
{{- fail "permit-gateway: redis.clusterNodes sets config.cache.redis_url: leave config.cache.redis_url and redis.existingSecret unset (or put the whole redis+cluster:// URL in one of them instead)." }}
{{- end }}
{{- range $i, $node := $clusterNodes }}
{{- if not (regexMatch "^[A-Za-z0-9.-]+:[0-9]{1,5}$" (toString $node)) }}
{{- fail (printf "permit-gateway: redis.clusterNodes[%d] must be host:port (no scheme, no password: put a URL with a password in redis.existingSecret)" $i) }}
{{- end }}
{{- end }}
{{- if not (or .Values.upstream.apiKey .Values.upstream.existingSecret) }}
{{- fail "permit-gateway: the upstream API key is required: set upstream.apiKey (the chart creates a Secret) or upstream.existingSecret (a Secret with the key under upstream.existingSecretKey)." }}
{{- end }}
{{- if or (hasKey $upstream "api_key") (hasKey $upstream "api_key_file") }}
{{- fail "permit-gateway: do not set config.upstream.api_key or api_key_file: give the key as upstream.apiKey or upstream.existingSecret (it is mounted as a file)." }}
{{- end }}
{{- range $i, $team := .Values.teams }}
{{- if not (and $team.name (regexMatch "^[a-z0-9_-]{1,64}$" (toString $team.name))) }}
{{- fail (printf "permit-gateway: teams[%d].name must be 1-64 of [a-z0-9_-] (it is a metric label)" $i) }}
{{- end }}
{{- range $k, $_ := $team }}
{{- if not (has $k (list "name" "token_sha256" "not_after" "tokens" "credit_limit" "requests_per_minute" "clamp_to_budget" "weight")) }}
{{- fail (printf "permit-gateway: teams[%d].%s is not a team key (name, token_sha256, not_after, tokens, credit_limit, requests_per_minute, clamp_to_budget, weight)" $i $k) }}
{{- end }}
{{- end }}
{{- /* A team's token is its token_sha256 (the app `default`), the apps of
     its tokens, or both: a team without one could never be used. */}}
{{- $tokens := default list $team.tokens }}
{{- if not (kindIs "slice" $tokens) }}
{{- fail (printf "permit-gateway: teams[%d] (%s): tokens must be a list of apps, each with name and token_sha256" $i (toString $team.name)) }}
{{- end }}
{{- if not (kindIs "invalid" $team.token_sha256) }}
{{- if not (regexMatch "^[0-9a-fA-F]{64}$" (toString $team.token_sha256)) }}
{{- fail (printf "permit-gateway: teams[%d] (%s): token_sha256 must be the 64-hex SHA-256 of the team's token (`permit-gateway token` prints it); plaintext tokens are never accepted" $i (toString $team.name)) }}
{{- end }}
{{- else if not $tokens }}
{{- fail (printf "permit-gateway: teams[%d] (%s) has no token: set token_sha256 (the 64-hex SHA-256 of the team's token; `permit-gateway token` prints it) or give it tokens (one per app, each with name and token_sha256)" $i (toString $team.name)) }}
{{- end }}
{{- range $j, $app := $tokens }}
{{- $at := printf "permit-gateway: teams[%d] (%s) tokens[%d]" $i (toString $team.name) $j }}
{{- if not (kindIs "map" $app) }}
{{- fail (printf "%s: must be an app: name, token_sha256 and optionally not_after, credit_limit, class" $at) }}
{{- end }}
{{- range $k, $_ := $app }}
{{- if not (has $k (list "name" "token_sha256" "not_after" "credit_limit" "class")) }}
{{- fail (printf "%s.%s is not a token key (name, token_sha256, not_after, credit_limit, class)" $at $k) }}
{{- end }}
{{- end }}
{{- /* The app's name is attributed in the ledger, the access log and one
     metric's label, like a team's name. */}}
{{- if not (and $app.name (regexMatch "^[a-z0-9_-]{1,64}$" (toString $app.name))) }}
{{- fail (printf "%s: name must be 1-64 of [a-z0-9_-], unique in the team (it names the app in usage, logs and metrics)" $at) }}
{{- end }}
{{- if not (regexMatch "^[0-9a-fA-F]{64}$" (toString (default "" $app.token_sha256))) }}
{{- fail (printf "%s (%s): token_sha256 must be the 64-hex SHA-256 of the app's token (`permit-gateway token` prints it); plaintext tokens are never accepted" $at (toString $app.name)) }}
{{- end }}
{{- end }}
{{- end }}
{{- $tgp := int64 (include "permit-gateway.terminationGracePeriodSeconds" .) }}
{{- $need := add (int64 (default 0 .Values.preStopSleepSeconds)) (int64 (include "permit-gateway.drainSecs" .)) }}
{{- if le $tgp $need }}
{{- fail (printf "permit-gateway: terminationGracePeriodSeconds=%d must be longer than preStopSleepSeconds + config.server.shutdown_grace_secs = %d, or in-flight requests are killed mid-drain." $tgp $need) }}
{{- end }}
{{- end }}

{{/* One TOML value: strings quoted, whole numbers without a fraction. */}}
{{- define "permit-gateway.tomlValue" -}}
{{- $v := . }}
{{- $k := kindOf $v }}
{{- if eq $k "string" }}{{ toJson $v }}
{{- else if eq $k "bool" }}{{ printf "%t" $v }}
{{- else if or (eq $k "float64") (eq $k "float32") }}
{{- if eq (float64 (int64 $v)) (float64 $v) }}{{ printf "%d" (int64 $v) }}{{ else }}{{ printf "%v" $v }}{{ end }}
{{- else if hasPrefix "int" $k }}{{ printf "%d" (int64 $v) }}
{{- else if hasPrefix "uint" $k }}{{ printf "%d" (int64 $v) }}
{{- else if eq $k "slice" }}[{{ range $i, $e := $v }}{{ if $i }}, {{ end }}{{ include "permit-gateway.tomlValue" $e }}{{ end }}]
{{- else }}{{ fail (printf "permit-gateway: cannot write %v (%s) as a TOML value" $v $k) }}
{{- end }}
{{- end }}

{{/* A TOML table: dict "name" "cache" "table" $map. Scalars, then sub-tables. */}}
{{- define "permit-gateway.tomlTable" -}}
{{- $name := .name }}
{{- $table := .table -}}
[{{ $name }}]
{{- range $k, $v := $table }}
{{- if and (not (kindIs "map" $v)) (not (kindIs "invalid" $v)) }}
{{ $k }} = {{ include "permit-gateway.tomlValue" $v }}
{{- end }}
{{- end }}
{{- range $k, $v := $table }}
{{- if kindIs "map" $v }}

{{ include "permit-gateway.tomlTable" (dict "name" (printf "%s.%s" $name $k) "table" $v) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The gateway.toml of the ConfigMap. */}}
{{- define "permit-gateway.configToml" -}}
{{- $cfg := deepCopy (default dict .Values.config) }}
{{- range $section := list "server" "upstream" "cache" "quota" "redis" "admin" "log" "tracing" }}
{{- if not (kindIs "map" (get $cfg $section)) }}
{{- $_ := set $cfg $section dict }}
{{- end }}
{{- end }}
{{- range $section, $_ := $cfg }}
{{- if not (has $section (list "server" "upstream" "cache" "quota" "redis" "admin" "log" "tracing")) }}
{{- fail (printf "permit-gateway: config.%s is not a config section (server, upstream, cache, quota, redis, admin, log, tracing; teams go in `teams:`)" $section) }}
{{- end }}
{{- end }}
{{- $_ := set $cfg.server "listen" (printf "0.0.0.0:%d" (int .Values.ports.http)) }}
{{- $_ = set $cfg.server "admin_listen" (printf "0.0.0.0:%d" (int .Values.ports.admin)) }}
{{- $_ = set $cfg.upstream "api_key_file" (include "permit-gateway.keyFile" .) }}
{{- $_ = set $cfg.quota "path" (printf "%s/ledger" (include "permit-gateway.dataDir" .)) }}
{{- /* The disk tier (issue 37) beside the ledger, on the same volume. */}}
{{- if not (hasKey $cfg.cache "disk_path") }}
{{- $_ = set $cfg.cache "disk_path" (printf "%s/cache.redb" (include "permit-gateway.dataDir" .)) }}
{{- end }}
{{- /* On the emptyDir (no PVC), a budget inside its 256Mi limit: the file is
     up to twice its entries. */}}
{{- if and (not (hasKey $cfg.cache "disk_max_bytes")) (not (and .Values.persistence.enabled (eq (include "permit-gateway.store" .) "file"))) }}
{{- $_ = set $cfg.cache "disk_max_bytes" 100663296 }}
{{- end }}
{{- with .Values.redis.clusterNodes }}
{{- $_ = set $cfg.cache "redis_url" (printf "redis+cluster://%s" (join "," .)) }}
{{- end }}
{{- with .Values.redis.tls }}
{{- if .existingSecret }}
{{- $_ = set $cfg.redis "tls_ca_file" (printf "/run/secrets/permit-gateway-redis-tls/%s" .caKey) }}
{{- if and .certKey .keyKey }}
{{- $_ = set $cfg.redis "tls_cert_file" (printf "/run/secrets/permit-gateway-redis-tls/%s" .certKey) }}
{{- $_ = set $cfg.redis "tls_key_file" (printf "/run/secrets/permit-gateway-redis-tls/%s" .keyKey) }}
{{- else if or .certKey .keyKey }}
{{- fail "permit-gateway: redis.tls.certKey and redis.tls.keyKey go together (a client certificate and its key)" }}
{{- end }}
{{- end }}
{{- end -}}
# Rendered by the permit-gateway Helm chart from values.yaml; every key is
# explained in config/defaults.toml and docs/operations.md.
{{- range $section := list "server" "upstream" "cache" "quota" "redis" "admin" "log" "tracing" }}

{{ include "permit-gateway.tomlTable" (dict "name" $section "table" (get $cfg $section)) }}
{{- end }}
{{- range .Values.teams }}

[[teams]]
name = {{ toJson .name }}
{{- if not (kindIs "invalid" .token_sha256) }}
token_sha256 = {{ toJson (lower .token_sha256) }}
{{- end }}
{{- if not (kindIs "invalid" .not_after) }}
not_after = {{ toJson (toString .not_after) }}
{{- end }}
{{- if not (kindIs "invalid" .credit_limit) }}
credit_limit = {{ include "permit-gateway.tomlValue" .credit_limit }}
{{- end }}
{{- if not (kindIs "invalid" .requests_per_minute) }}
requests_per_minute = {{ include "permit-gateway.tomlValue" .requests_per_minute }}
{{- end }}
{{- if not (kindIs "invalid" .clamp_to_budget) }}
clamp_to_budget = {{ include "permit-gateway.tomlValue" .clamp_to_budget }}
{{- end }}
{{- if not (kindIs "invalid" .weight) }}
weight = {{ include "permit-gateway.tomlValue" .weight }}
{{- end }}
{{- /* After the team's own keys: in TOML every key below [[teams.tokens]]
     belongs to the app. */}}
{{- range (default list .tokens) }}

[[teams.tokens]]
name = {{ toJson .name }}
token_sha256 = {{ toJson (lower .token_sha256) }}
{{- if not (kindIs "invalid" .not_after) }}
{{- /* Quoted, as written: the gateway reads a date or an RFC 3339
       time from text. */}}
not_after = {{ toJson (toString .not_after) }}
{{- end }}
{{- if not (kindIs "invalid" .credit_limit) }}
credit_limit = {{ include "permit-gateway.tomlValue" .credit_limit }}
{{- end }}
{{- if not (kindIs "invalid" .class) }}
class = {{ toJson .class }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
