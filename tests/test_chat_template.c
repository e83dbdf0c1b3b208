/* src/data/chat_template.c: fixed renderings of ChatML, Qwen2.5's and Llama-2 chat and the
 * refusals (no arguments), and the renderer for tests/chat_template.sh, which compares it with
 * transformers' apply_chat_template:
 *   test_chat_template render TEMPLATE.txt BOS EOS CONVERSATIONS.json
 * prints a JSON array with the rendering of each conversation ({"messages": [...],
 * "add_generation_prompt": bool}) under the template recognised in TEMPLATE.txt. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/data/chat_template.h"
#include "tests/check.h"

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (s) s[n] = '\0';
    fclose(f);
    return s;
}

/* Renders messages with t and compares with want (NULL: the rendering must fail with an
 * error holding why). */
static void expect(const char *what, const chat_template *t, const chat_message *m, int n,
                   int gen, const char *want, const char *why) {
    byte_buf out = {0};
    char err[512] = "";
    int rc = chat_render(t, m, n, gen, &out, err, sizeof err);
    int ok = want ? rc == 0 && out.n == strlen(want) && memcmp(out.data, want, out.n) == 0
                  : rc != 0 && strstr(err, why) != NULL;
    check(ok, "%s%s%s", what, ok ? "" : ": got ", ok ? "" : (rc ? err : ""));
    if (!ok && rc == 0) printf("     rendered '%.*s'\n     expected '%s'\n", (int)out.n, out.data, want);
    free(out.data);
}

static void fixed(void) {
    chat_template chatml, llama2, smol, qwen;
    char err[512];
    chat_template_named(&chatml, "chatml", err, sizeof err);
    chat_template_named(&llama2, "llama2", err, sizeof err);
    chat_template_named(&qwen, "qwen2.5", err, sizeof err);
    chat_template llama3;
    chat_template_named(&llama3, "llama3", err, sizeof err);
    const char *smol_text =
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
        "Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
        "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|im_start|>assistant\\n' }}{% endif %}";
    int rc = chat_template_recognise(&smol, smol_text, NULL, NULL, "smol", err, sizeof err);
    check(rc == 0 && smol.default_system,
          "SmolLM2's template is ChatML with a default system message%s%s", rc ? ": " : "",
          rc ? err : "");
    const chat_message user[1] = {{"user", "Hi"}};
    const chat_message sys_user_asst[3] = {{"system", "Be brief."}, {"user", " Hi "},
                                           {"assistant", "Hello.\n"}};
    expect("chatml, one user turn, generation prompt", &chatml, user, 1, 1,
           "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", NULL);
    expect("smollm2: its default system message first", &smol, user, 1, 0,
           "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
           "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n", NULL);
    expect("smollm2: a system message of its own replaces it", &smol, sys_user_asst, 2, 0,
           "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n", NULL);
    expect("llama2: system block in the first turn, strip(), eos after the answer", &llama2,
           sys_user_asst, 3, 1,
           "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n Hi [/INST] Hello. </s>", NULL);
    /* Qwen2.5-7B-Instruct's rendering of this conversation, as published beside its template */
    const chat_message qa[2] = {{"user", "What's your favourite LLM framework?"},
                                {"assistant", "llama.cpp!"}};
    expect("qwen2.5: Qwen's default system message first", &qwen, qa, 2, 1,
           "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
           "assistant.<|im_end|>\n<|im_start|>user\nWhat's your favourite LLM framework?"
           "<|im_end|>\n<|im_start|>assistant\nllama.cpp!<|im_end|>\n<|im_start|>assistant\n",
           NULL);
    const chat_message two_users[2] = {{"user", "a"}, {"user", "b"}};
    expect("llama2 refuses two user turns in a row", &llama2, two_users, 2, 0, NULL, "alternate");
    const chat_message tool[1] = {{"tool", "x"}};
    expect("an unknown role is refused", &chatml, tool, 1, 0, NULL, "role 'tool'");
    const chat_message late_system[2] = {{"user", "a"}, {"system", "b"}};
    /* the ChatML template writes every message as it comes, whatever its place */
    expect("chatml: a system message after the first renders in place", &chatml, late_system,
           2, 0, "<|im_start|>user\na<|im_end|>\n<|im_start|>system\nb<|im_end|>\n", NULL);
    expect("llama2: a system message after the first is refused", &llama2, late_system, 2, 0,
           NULL, "comes first");
    /* Llama-3.1's: the system block always, empty without a first system message; a later
     * system message in place; contents stripped */
#define L3_HEAD(s)                                                                             \
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "   \
    "December 2023\nToday Date: 26 Jul 2024\n\n" s "<|eot_id|>"
    expect("llama3: the default system block, a later system message in place", &llama3,
           late_system, 2, 1,
           L3_HEAD("") "<|start_header_id|>user<|end_header_id|>\n\na<|eot_id|>"
           "<|start_header_id|>system<|end_header_id|>\n\nb<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\n", NULL);
    const chat_message l3_sys[3] = {{"system", " S \n"}, {"user", "\tq "}, {"assistant", " a"}};
    expect("llama3: the first system message in the block, contents stripped", &llama3, l3_sys,
           3, 0,
           L3_HEAD("S") "<|start_header_id|>user<|end_header_id|>\n\nq<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\na<|eot_id|>", NULL);
#undef L3_HEAD
    chat_template other;
    rc = chat_template_recognise(&other, "{{ messages[0]['content'] }}", "<s>", "</s>", "x.json",
                                 err, sizeof err);
    check(rc != 0 && strstr(err, "x.json"), "another template is refused naming its file%s%s",
          rc ? ": " : "", rc ? err : "");
    rc = chat_template_named(&other, "vicuna", err, sizeof err);
    check(rc != 0, "an unknown template name is refused%s%s", rc ? ": " : "", rc ? err : "");
    chat_template_free(&smol);
    chat_template_free(&qwen);
}

static int render(const char *template_file, const char *bos, const char *eos,
                  const char *conversations) {
    char *text = slurp(template_file), *json = slurp(conversations), err[512];
    cJSON *all = json ? cJSON_Parse(json) : NULL;
    chat_template t;
    if (!text || !cJSON_IsArray(all) ||
        chat_template_recognise(&t, text, bos, eos, template_file, err, sizeof err) != 0) {
        fprintf(stderr, "test_chat_template: %s\n", text && all ? err : "cannot read the inputs");
        return 2;
    }
    cJSON *out = cJSON_CreateArray(), *conv;
    cJSON_ArrayForEach(conv, all) {
        const cJSON *msgs = cJSON_GetObjectItem(conv, "messages"), *m;
        chat_message ms[16];
        int n = 0;
        cJSON_ArrayForEach(m, msgs) if (n < 16) {
            ms[n].role = cJSON_GetStringValue(cJSON_GetObjectItem(m, "role"));
            ms[n].content = cJSON_GetStringValue(cJSON_GetObjectItem(m, "content"));
            n++;
        }
        byte_buf b = {0};
        int gen = cJSON_IsTrue(cJSON_GetObjectItem(conv, "add_generation_prompt"));
        if (chat_render(&t, ms, n, gen, &b, err, sizeof err) != 0) {
            cJSON_AddItemToArray(out, cJSON_CreateNull());
        } else {
            byte_buf_append(&b, "", 1);
            cJSON_AddItemToArray(out, cJSON_CreateString(b.data));
        }
        free(b.data);
    }
    char *s = cJSON_Print(out);
    puts(s);
    free(s);
    cJSON_Delete(out);
    cJSON_Delete(all);
    chat_template_free(&t);
    free(text);
    free(json);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 6 && strcmp(argv[1], "render") == 0) return render(argv[2], argv[3], argv[4], argv[5]);
    printf("# reproduce: tests/test_chat_template\n");
    fixed();
    return check_exit();
}
