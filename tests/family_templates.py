"""Chat templates of the families' popular models, copied verbatim as test data (with their sources).

These are data, not code: tests/test_family_templates.py renders them through llmedge.template and
through a plain Jinja2 environment set up as Hugging Face transformers renders chat templates.

Sources:
- QWEN25: Qwen/Qwen2.5-*-Instruct ``tokenizer_config.json`` ``chat_template`` (the same text llama.cpp's
  converter stores as ``tokenizer.chat_template`` in Qwen 2.5 GGUFs), as quoted verbatim in public
  llama.cpp server configurations.
- LLAMA3, PHI3_MINI, PHI4, GEMMA, GRANITE3: the template strings of llama.cpp's
  tests/test-chat-template.cpp (ggml-org/llama.cpp at 03f94f19), test cases "Llama-3"
  (meta-llama/Meta-Llama-3-8B-Instruct), "Phi-3-mini", "phi-4", "google/gemma-7b-it" and
  "ibm-granite/granite-3.0-8b-instruct"; LLAMACPP_OUTPUTS are that file's expected outputs for its
  conversation (LLAMACPP_CONVERSATION), where llama.cpp renders the template as written.
"""

QWEN25 = r'''{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
'''

LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
          "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
          "{{ content }}{% endfor %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}")

PHI3_MINI = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}"
             "{{'<|user|>' + '\n' + message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}"
             "{% elif (message['role'] == 'assistant') %}{{message['content'] + '<|end|>' + '\n'}}{% endif %}"
             "{% endfor %}")

PHI4 = ("{% for message in messages %}{% if (message['role'] == 'system') %}"
        "{{'<|im_start|>system<|im_sep|>' + message['content'] + '<|im_end|>'}}"
        "{% elif (message['role'] == 'user') %}"
        "{{'<|im_start|>user<|im_sep|>' + message['content'] + '<|im_end|><|im_start|>assistant<|im_sep|>'}}"
        "{% elif (message['role'] == 'assistant') %}{{message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}")

GEMMA = (r"{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
         r"{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
         r"{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
         r"{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}"
         r"{% set role = message['role'] %}{% endif %}"
         r"{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
         r"{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")

GRANITE3 = (
    "{%- if tools %}\n    {{- '<|start_of_role|>available_tools<|end_of_role|>\n' }}\n    {%- for tool in tools %}\n"
    "    {{- tool | tojson(indent=4) }}\n    {%- if not loop.last %}\n        {{- '\n\n' }}\n    {%- endif %}\n"
    "    {%- endfor %}\n    {{- '<|end_of_text|>\n' }}\n{%- endif %}\n{%- for message in messages %}\n"
    "    {%- if message['role'] == 'system' %}\n"
    "    {{- '<|start_of_role|>system<|end_of_role|>' + message['content'] + '<|end_of_text|>\n' }}\n"
    "    {%- elif message['role'] == 'user' %}\n"
    "    {{- '<|start_of_role|>user<|end_of_role|>' + message['content'] + '<|end_of_text|>\n' }}\n"
    "    {%- elif message['role'] == 'assistant' %}\n"
    "    {{- '<|start_of_role|>assistant<|end_of_role|>'  + message['content'] + '<|end_of_text|>\n' }}\n"
    "    {%- elif message['role'] == 'assistant_tool_call' %}\n"
    "    {{- '<|start_of_role|>assistant<|end_of_role|><|tool_call|>' + message['content'] + '<|end_of_text|>\n' }}\n"
    "    {%- elif message['role'] == 'tool_response' %}\n"
    "    {{- '<|start_of_role|>tool_response<|end_of_role|>' + message['content'] + '<|end_of_text|>\n' }}\n"
    "    {%- endif %}\n    {%- if loop.last and add_generation_prompt %}\n"
    "    {{- '<|start_of_role|>assistant<|end_of_role|>' }}\n    {%- endif %}\n{%- endfor %}"
)

TEMPLATES = {"qwen2": QWEN25, "llama": LLAMA3, "phi3": PHI3_MINI, "phi3-phi4": PHI4, "gemma": GEMMA,
             "granite": GRANITE3}
# BOS / EOS texts of each family's vocabulary
SPECIAL_TEXTS = {"qwen2": ("", "<|im_end|>"), "llama": ("<|begin_of_text|>", "<|eot_id|>"),
                 "phi3": ("<s>", "<|endoftext|>"), "phi3-phi4": ("", "<|im_end|>"),
                 "gemma": ("<bos>", "<eos>"), "granite": ("", "<|end_of_text|>")}

LLAMACPP_CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi there"},
    {"role": "user", "content": "Who are you"},
    {"role": "assistant", "content": "   I am an assistant   "},
    {"role": "user", "content": "Another question"},
]

# rendered with add_generation_prompt and bos_token "" (test-chat-template.cpp's defaults)
LLAMACPP_OUTPUTS = {
    "llama": ("<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant"
              "<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are you"
              "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|><|start_header_id|>"
              "assistant<|end_header_id|>\n\n"),
    "phi3-phi4": ("<|im_start|>system<|im_sep|>You are a helpful assistant<|im_end|><|im_start|>user<|im_sep|>"
                  "Hello<|im_end|><|im_start|>assistant<|im_sep|>Hi there<|im_end|><|im_start|>user<|im_sep|>"
                  "Who are you<|im_end|><|im_start|>assistant<|im_sep|>   I am an assistant   <|im_end|>"
                  "<|im_start|>user<|im_sep|>Another question<|im_end|><|im_start|>assistant<|im_sep|>"),
    "granite": ("<|start_of_role|>system<|end_of_role|>You are a helpful assistant<|end_of_text|>\n"
                "<|start_of_role|>user<|end_of_role|>Hello<|end_of_text|>\n<|start_of_role|>assistant"
                "<|end_of_role|>Hi there<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Who are you"
                "<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>   I am an assistant   "
                "<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Another question<|end_of_text|>\n"
                "<|start_of_role|>assistant<|end_of_role|>"),
}
