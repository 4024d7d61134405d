"""Chat templates of the families' popular models, copied verbatim as test data (with their sources).

These are data, not code: tests/test_family_templates.py renders them through llmedge.template and
through a plain Jinja2 environment set up as Hugging Face transformers renders chat templates.

Sources:
- QWEN25: Qwen/Qwen2.5-*-Instruct ``tokenizer_config.json`` ``chat_template`` (the same text llama.cpp's
  converter stores as ``tokenizer.chat_template`` in Qwen 2.5 GGUFs), as quoted verbatim in public
  llama.cpp server configurations.
- LLAMA32: meta-llama/Llama-3.2-1B-Instruct / -3B-Instruct ``tokenizer_config.json`` ``chat_template``, as
  quoted verbatim in public training code.
- GEMMA3: the ``tokenizer.chat_template`` of ggml-org/gemma-3-1b-it-GGUF and gemma-3-12b-it-GGUF (Hugging
  Face's model API ``gguf.chat_template`` field, as quoted verbatim in a public session log).
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

LLAMA32 = r'''{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
'''

GEMMA3 = (
    '{{ bos_token }}\n'
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n"
    '\n'
    "' -%}\n"
    '    {%- else -%}\n'
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n"
    '\n'
    "' -%}\n"
    '    {%- endif -%}\n'
    '    {%- set loop_messages = messages[1:] -%}\n'
    '{%- else -%}\n'
    '    {%- set first_user_prefix = "" -%}\n'
    '    {%- set loop_messages = messages -%}\n'
    '{%- endif -%}\n'
    '{%- for message in loop_messages -%}\n'
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    '        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}\n'
    '    {%- endif -%}\n'
    "    {%- if (message['role'] == 'assistant') -%}\n"
    '        {%- set role = "model" -%}\n'
    '    {%- else -%}\n'
    "        {%- set role = message['role'] -%}\n"
    '    {%- endif -%}\n'
    "    {{ '<start_of_turn>' + role + '\n"
    '\' + (first_user_prefix if loop.first else "") }}\n'
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    '            {%- endif -%}\n'
    '        {%- endfor -%}\n'
    '    {%- else -%}\n'
    '        {{ raise_exception("Invalid content type") }}\n'
    '    {%- endif -%}\n'
    "    {{ '<end_of_turn>\n"
    "' }}\n"
    '{%- endfor -%}\n'
    '{%- if add_generation_prompt -%}\n'
    "    {{'<start_of_turn>model\n"
    "'}}\n"
    '{%- endif -%}\n'
)

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

TEMPLATES = {"qwen2": QWEN25, "llama": LLAMA3, "llama-3.2": LLAMA32, "phi3": PHI3_MINI, "phi3-phi4": PHI4,
             "gemma": GEMMA, "gemma3": GEMMA3, "granite": GRANITE3}
# BOS / EOS texts of each family's vocabulary
SPECIAL_TEXTS = {"qwen2": ("", "<|im_end|>"), "llama": ("<|begin_of_text|>", "<|eot_id|>"),
                 "llama-3.2": ("<|begin_of_text|>", "<|eot_id|>"), "gemma3": ("<bos>", "<eos>"),
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
