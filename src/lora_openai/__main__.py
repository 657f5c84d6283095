from lora_openai.cli import main

raise SystemExit(main())
