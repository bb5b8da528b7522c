# The traces, rate grids and rates of the SLO searches at the published GPU scale, sourced by
# the slo_* scripts (from the repository root).
# shellcheck disable=SC2034
declare -A file=([sharegpt]=../shared/traces/sharegpt_lengths_llama2.csv
                 [azure]=../shared/traces/AzureLLMInferenceTrace_conv.csv)
declare -A grid=([sharegpt]=0.25,0.5,0.75,1,1.25,1.5,2,2.5,3,4
                 [azure]=0.5,1,1.5,2,2.5,3,4,5,6,8)
declare -A rate=([sharegpt]="--rate 0.5" [azure]="")
