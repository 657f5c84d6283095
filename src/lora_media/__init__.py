"""Media decoding shared by the serving core (lora_serving) and the OpenAI front (lora_openai)."""
