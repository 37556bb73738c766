{{- define "pybk.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "pybk.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "pybk.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (printf "%s-operator" (include "pybk.fullname" .)) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "pybk.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "pybk.etcdName" -}}
{{- printf "%s-etcd" (include "pybk.fullname" .) -}}
{{- end -}}

{{- define "pybk.defaultMetadataUri" -}}
{{- if .Values.operator.defaultMetadataUri -}}
{{- .Values.operator.defaultMetadataUri -}}
{{- else if .Values.etcd.enabled -}}
{{- printf "etcd://%s.%s.svc:2379/%s" (include "pybk.etcdName" .) .Release.Namespace .Values.etcd.prefix -}}
{{- end -}}
{{- end -}}

{{- define "pybk.sparkServiceAccountName" -}}
{{- default (printf "%s-spark" (include "pybk.fullname" .)) .Values.spark.serviceAccountName -}}
{{- end -}}
