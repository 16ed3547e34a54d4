"""artemis.protocol"""
