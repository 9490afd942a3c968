"""The KV cache a profile will get, answered before it starts by the vLLM in its own image.

`host` asks (the question, the container, the cache, a start's prediction); `question` is what
crosses into the container; `engine` answers there with vLLM's own engine core sizing
(`engine_plan`) over specs from vLLM's layer classes (`glm53_specs` for GLM-5.3, whose
checkpoint is not needed); `report` prints the answer. The commands are `launch capacity`
(`make capacity`), and the start's prediction in `launch up`/`render` and smoke's check.
"""
