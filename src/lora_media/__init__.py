"""Media decoding and Whisper's language table, shared by the serving core (lora_serving) and the
OpenAI front (lora_openai), which never imports the core."""
